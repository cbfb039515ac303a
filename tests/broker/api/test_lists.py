"""The other lists a page at a time: ``/v1/clusters``, ``/v1/pipelines``, ``/v1/jobs/{id}/events``, the filters
and newest-first order of ``/v1/jobs``, and a byte bound on ``/v1/jobs/{id}/logs``. Each pages every item
once while items are added, keeps to the caller's team, and refuses hostile cursors, filters and sizes
with a 4xx naming the parameter."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from broker.store.tables import ClusterRow, JobEventRow
from tests.broker.api.conftest import Api

PIPELINE = """\
name: prep
resources:
  accelerators: V100:1
run: python prep.py
---
name: fit
resources:
  accelerators: V100:1
run: python fit.py
"""
T0 = datetime(2026, 3, 1, tzinfo=UTC)


def _all(api: Api, path: str, key: str, headers: dict[str, str] | None = None, **params: Any) -> list[Any]:
    """Every item, a page of 2 at a time, following ``X-Next-After``."""
    seen: list[Any] = []
    cursor: str | None = None
    while True:
        response = api.client.get(path, params={**params, "limit": 2, **({"after": cursor} if cursor else {})},
                                  headers=headers or api.alpha)
        assert response.status_code == 200, response.text
        seen += [item[key] for item in response.json()]
        cursor = response.headers.get("X-Next-After")
        if cursor is None:
            return seen


def _clusters(api: Api, job_id: str, count: int, start: int) -> list[str]:
    ids = [f"c-{job_id}-{i}" for i in range(start, start + count)]
    with api.store.transaction() as s:
        for i, cluster_id in enumerate(ids):
            s.add(ClusterRow(id=cluster_id, launch_key=cluster_id, job_id=job_id, backend="local", cloud="aws",
                             region="r", zone="z", instance_type="p3.2xlarge", gpus_per_node=1, num_nodes=1,
                             spot=True, price_per_node_hour=1.0, on_demand_price_per_node_hour=3.0,
                             state="UP" if i % 2 else "TERMINATED", handle={},
                             created_at=T0 + timedelta(minutes=start + i)))
    return ids


def test_clusters_page_through_the_teams_own_while_more_come_up(api: Api) -> None:
    mine, theirs = api.submit(api.alpha), api.submit(api.beta)
    first = _clusters(api, mine, 3, 0)
    _clusters(api, theirs, 2, 0)
    response = api.client.get("/v1/clusters", params={"limit": 2}, headers=api.alpha)
    assert [c["cluster_id"] for c in response.json()] == first[:2]
    added = _clusters(api, mine, 2, 10)  # come up between pages: listed after the others
    seen = [c["cluster_id"] for c in response.json()]
    cursor = response.headers["X-Next-After"]
    while cursor:
        page = api.client.get("/v1/clusters", params={"limit": 2, "after": cursor}, headers=api.alpha)
        seen += [c["cluster_id"] for c in page.json()]
        cursor = page.headers.get("X-Next-After", "")
    assert seen == first + added
    assert _all(api, "/v1/clusters", "cluster_id", state="up") == [first[1], added[1]]
    assert _all(api, "/v1/clusters", "cluster_id", job=mine) == first + added
    assert _all(api, "/v1/clusters", "cluster_id", api.beta) == [f"c-{theirs}-0", f"c-{theirs}-1"]


def test_pipelines_page_with_their_stages_in_order(api: Api) -> None:
    ids = []
    for _ in range(3):
        response = api.client.post("/v1/pipelines", json={"spec": PIPELINE}, headers=api.alpha)
        assert response.status_code == 201, response.text
        ids.append(response.json()["pipeline_id"])
    api.client.post("/v1/pipelines", json={"spec": PIPELINE}, headers=api.beta)
    api.submit(api.alpha)  # a lone job is no pipeline
    assert _all(api, "/v1/pipelines", "pipeline_id") == ids
    first = api.client.get("/v1/pipelines", params={"limit": 1}, headers=api.alpha).json()[0]
    assert [(stage["stage"], stage["name"], stage["state"]) for stage in first["stages"]] == [
        (1, "prep", "PENDING"), (2, "fit", "PENDING")]
    stages = api.client.get("/v1/jobs", params={"pipeline": ids[0]}, headers=api.alpha).json()
    assert [job["job_id"] for job in stages] == [stage["job_id"] for stage in first["stages"]]


def test_a_jobs_events_page_in_order_and_by_kind(api: Api) -> None:
    job_id = api.submit(api.alpha)
    with api.store.transaction() as s:
        for i in range(5):
            s.add(JobEventRow(job_id=job_id, at=T0 + timedelta(seconds=i), kind="waiting" if i % 2 else "transition",
                              from_state="PENDING", to_state="PENDING", detail={"i": i}))
    every = _all(api, f"/v1/jobs/{job_id}/events", "id")
    assert every == sorted(every) and len(every) >= 5
    kinds = api.client.get(f"/v1/jobs/{job_id}/events", params={"kind": "waiting"}, headers=api.alpha).json()
    assert [event["detail"] for event in kinds] == [{"i": 1}, {"i": 3}]
    assert api.client.get(f"/v1/jobs/{job_id}/events", headers=api.beta).status_code == 403
    assert api.client.get("/v1/jobs/j-00000000/events", headers=api.alpha).status_code == 404


def test_jobs_newest_first_and_by_name(api: Api) -> None:
    other = "name: other\nresources:\n  accelerators: V100:1\nrun: python x.py\n"
    jobs = [api.submit(api.alpha, other) if i % 2 else api.submit(api.alpha) for i in range(5)]
    assert _all(api, "/v1/jobs", "job_id", order="desc") == jobs[::-1]
    assert _all(api, "/v1/jobs", "job_id", name="other") == jobs[1::2]
    assert _all(api, "/v1/jobs", "job_id", name="other", order="desc", state="PENDING") == jobs[1::2][::-1]


def test_logs_answer_at_most_max_bytes_and_page_on_by_offsets(api: Api) -> None:
    job_id = api.submit(api.alpha)
    folder = api.home / "logs" / job_id
    folder.mkdir(parents=True)
    (folder / "attempt-1-node-0.log").write_text("a" * 700)
    (folder / "attempt-1-node-1.log").write_text("b" * 500)
    offsets: dict[str, int] = {}
    sizes = []
    while True:
        params = {"max_bytes": 512, "offset": [f"{name}:{end}" for name, end in offsets.items()]}
        chunks = api.client.get(f"/v1/jobs/{job_id}/logs", params=params, headers=api.alpha).json()["chunks"]
        if not chunks:
            break
        sizes.append(sum(chunk["end"] - chunk["start"] for chunk in chunks))
        offsets.update({chunk["file"]: chunk["end"] for chunk in chunks})
    assert sizes == [512, 512, 176] and offsets == {"attempt-1-node-0": 700, "attempt-1-node-1": 500}


@pytest.mark.parametrize(("path", "params", "field"), [
    ("/v1/jobs", {"state": "sleeping"}, "state"), ("/v1/jobs", {"state": "x" * 21}, "state"),
    ("/v1/jobs", {"name": "a\x00b"}, "name"), ("/v1/jobs", {"name": "x" * 201}, "name"),
    ("/v1/jobs", {"name": "line\nbreak"}, "name"), ("/v1/jobs", {"pipeline": "../p"}, "pipeline"),
    ("/v1/jobs", {"order": "sideways"}, "order"), ("/v1/jobs", {"order": "desc\x00"}, "order"),
    ("/v1/clusters", {"limit": 0}, "limit"), ("/v1/clusters", {"limit": 1001}, "limit"),
    ("/v1/clusters", {"limit": 10**30}, "limit"), ("/v1/clusters", {"after": "c-nobody"}, "after"),
    ("/v1/clusters", {"after": "c/../x"}, "after"), ("/v1/clusters", {"after": "c" * 65}, "after"),
    ("/v1/clusters", {"state": "melting"}, "state"), ("/v1/clusters", {"job": "j\x00"}, "job"),
    ("/v1/pipelines", {"limit": -1}, "limit"), ("/v1/pipelines", {"after": "p-nobody"}, "after"),
    ("/v1/pipelines", {"after": "p;drop"}, "after"),
    ("EVENTS", {"after": -1}, "after"), ("EVENTS", {"after": 2**63}, "after"), ("EVENTS", {"after": "x"}, "after"),
    ("EVENTS", {"kind": "Transition"}, "kind"), ("EVENTS", {"kind": "k" * 41}, "kind"),
    ("EVENTS", {"limit": 100_000}, "limit"),
    ("LOGS", {"max_bytes": 0}, "max_bytes"), ("LOGS", {"max_bytes": 2**40}, "max_bytes"),
    ("LOGS", {"max_bytes": "nan"}, "max_bytes"),
])
def test_hostile_cursors_filters_and_sizes_are_4xx_naming_the_parameter(api: Api, path: str, params: dict[str, Any],
                                                                         field: str) -> None:
    job_id = api.submit(api.alpha)
    path = {"EVENTS": f"/v1/jobs/{job_id}/events", "LOGS": f"/v1/jobs/{job_id}/logs"}.get(path, path)
    response = api.client.get(path, params=params, headers=api.alpha)
    assert 400 <= response.status_code < 500, response.text
    assert field in response.text, response.text
    assert "Traceback" not in response.text and len(response.text) < 2000


def test_a_cursor_of_another_teams_cluster_or_pipeline_is_refused(api: Api) -> None:
    theirs = api.submit(api.beta)
    (cluster,) = _clusters(api, theirs, 1, 0)
    pipeline = api.client.post("/v1/pipelines", json={"spec": PIPELINE}, headers=api.beta).json()["pipeline_id"]
    for path, cursor in (("/v1/clusters", cluster), ("/v1/pipelines", pipeline)):
        response = api.client.get(path, params={"after": cursor}, headers=api.alpha)
        assert response.status_code == 422 and "after" in response.text, response.text
