"""``POST /v1/pipelines``: a multi-document job file's stages recorded together, as `broker launch` records
them, for the token's team; whatever is wrong with any stage is a 4xx naming it, and nothing is stored."""

from __future__ import annotations

import json
from datetime import UTC, datetime

import pytest
from sqlalchemy import func, select

from broker.api.limits import MAX_BODY_BYTES
from broker.spec.yaml_lines import MAX_STAGES
from broker.store.tables import JobEventRow, JobRow, PolicyOverrideRow
from tests.broker.api.conftest import JOB, Api

STAGE = """\
name: {name}
resources:
  accelerators: V100:1
run: echo {name}
"""
CHAIN = "name: etl\n---\n" + STAGE.format(name="prep") + "---\n" + STAGE.format(name="train")
GROUP = ("name: duo\nexecution: parallel\n---\n" + STAGE.format(name="left") + "---\n"
         + STAGE.format(name="right"))


def _jobs(api: Api) -> list[JobRow]:
    with api.store.transaction() as s:
        return list(s.scalars(select(JobRow).order_by(JobRow.stage)))


def _stored(api: Api) -> int:
    with api.store.transaction() as s:
        return int(s.scalar(select(func.count()).select_from(JobRow)) or 0) + int(
            s.scalar(select(func.count()).select_from(JobEventRow)) or 0)


def _post(api: Api, text: str, headers: dict[str, str] | None = None) -> object:
    return api.client.post("/v1/pipelines", json={"spec": text, "source": "/jobs/etl.yaml"},
                           headers=api.alpha if headers is None else headers)


def test_a_chain_is_recorded_as_the_embedded_launch_records_it(api: Api) -> None:
    response = _post(api, CHAIN)
    assert response.status_code == 201, response.text
    body = response.json()
    assert (body["name"], body["kind"]) == ("etl", "chain")
    prep, train = _jobs(api)
    assert body["job_ids"] == [prep.id, train.id]
    assert body["pipeline_id"] == prep.pipeline_id == train.pipeline_id and prep.pipeline_id.startswith("p-")
    assert [(j.name, j.stage, j.team, j.state) for j in (prep, train)] == [
        ("prep", 1, "alpha", "PENDING"), ("train", 2, "alpha", "PENDING")]
    assert (prep.after_job_id, train.after_job_id) == (None, prep.id)  # the second waits for the first
    assert [s["stage"] for s in body["stages"]] == [1, 2]
    listed = {s["job_id"]: s["stage"] for s in api.client.get("/v1/jobs", headers=api.alpha).json()}
    assert listed == {prep.id: 1, train.id: 2}
    assert api.client.get("/v1/jobs", headers=api.beta).json() == []  # another team sees none of it


def test_a_job_groups_stages_are_queued_together(api: Api) -> None:
    response = _post(api, GROUP)
    assert response.status_code == 201, response.text
    assert response.json()["kind"] == "group"
    left, right = _jobs(api)
    assert (left.after_job_id, right.after_job_id) == (None, None)
    assert (left.name, right.name) == ("left", "right")


def test_each_stages_queue_gets_its_priority_at_this_hour(api: Api) -> None:
    now = datetime(2026, 1, 1, 8, tzinfo=UTC)
    with api.store.transaction() as s:
        s.add(PolicyOverrideRow(key="queue_priority:training", value=250, schedule="night", fire_time=now,
                                applied_at=now))
    response = _post(api, CHAIN + "broker:\n  priority: inference\n")
    assert response.status_code == 201, response.text
    prep, train = _jobs(api)
    assert (prep.priority, train.priority) == (250, 1000)


def test_without_a_valid_token_nothing_is_read_or_stored(api: Api) -> None:
    for headers in ({}, {"Authorization": "Bearer bkr_not-a-token"}):
        response = _post(api, CHAIN, headers)
        assert response.status_code == 401
    assert _stored(api) == 0


def test_a_stage_naming_another_team_is_403_and_no_stage_is_stored(api: Api) -> None:
    text = CHAIN + "broker:\n  team: beta\n"
    response = _post(api, text)
    assert response.status_code == 403
    assert "stage 2" in response.json()["detail"] and "beta" in response.json()["detail"]
    assert _stored(api) == 0


def test_a_one_task_file_is_refused_and_pointed_at_jobs(api: Api) -> None:
    response = _post(api, JOB)
    assert response.status_code == 422
    assert "POST /v1/jobs" in response.json()["message"]
    assert _stored(api) == 0


def test_jobs_refuses_a_pipeline_and_points_at_pipelines(api: Api) -> None:
    response = api.client.post("/v1/jobs", json={"spec": CHAIN}, headers=api.alpha)
    assert response.status_code == 422
    assert "POST /v1/pipelines" in response.json()["message"]
    assert _stored(api) == 0


BAD_SECOND_STAGE = [
    (CHAIN.replace("run: echo train\n", ""), ["spec", "stage", 2, "run"], "required"),
    (CHAIN.replace("V100:1\nrun: echo train", "H100:8\nrun: echo train"),
     ["spec", "stage", 2, "resources", "accelerators"], "market"),
    (CHAIN + "broker:\n  priority: urgent\n", ["spec", "stage", 2, "broker", "priority"], "expected one of"),
    (CHAIN.replace("name: train", "name: " + "t" * 300), ["spec", "stage", 2, "name"], "200 characters"),
    (CHAIN + "num_nodes: 99999999999\n", ["spec", "stage", 2, "num_nodes"], ""),
    (GROUP.replace("execution: parallel", "execution: parallel\nprimary_tasks: [nosuch]"), ["spec", "primary_tasks"],
     "nosuch"),
    (GROUP.replace("name: right", "name: left"), ["spec", "name"], "duplicate"),
    (CHAIN.replace("name: etl", "name: etl\nexecution: sideways"), ["spec", "execution"], "serial"),
    ("name: etl\n---\n---\n", ["spec"], ""),
    ("name: etl\n---\nrun: [unclosed\n", ["spec"], "line"),
    ("---\n".join(STAGE.format(name=f"s{n}") for n in range(MAX_STAGES + 5)), ["spec"],
     f"at most {MAX_STAGES} stages"),
    ("---\n" * 200_000, ["spec"], f"at most {MAX_STAGES} stages"),
    (CHAIN.replace("echo train", "echo 'a\x00b'"), ["spec"], "NUL"),
]


@pytest.mark.parametrize(("text", "loc", "words"), BAD_SECOND_STAGE,
                         ids=["no-run", "not-in-market", "bad-priority", "long-name", "huge-num-nodes",
                              "unknown-primary-task", "duplicate-name", "bad-execution", "no-task", "yaml-syntax",
                              "too-many-stages", "200k-empty-documents", "nul"])
def test_a_bad_stage_is_422_naming_it_and_stores_nothing(api: Api, text: str, loc: list[object],
                                                         words: str) -> None:
    response = _post(api, text)
    assert response.status_code == 422, response.text
    [problem] = response.json()["detail"]
    assert problem["loc"] == ["body", *loc], problem
    assert words.lower() in (problem["msg"] + response.json().get("message", "")).lower()
    assert "\n" not in response.json().get("message", "")
    assert _stored(api) == 0


def test_garbage_deep_and_huge_bodies_are_4xx_and_store_nothing(api: Api) -> None:
    headers = {**api.alpha, "Content-Type": "application/json"}
    cases = [
        (b"{not json", 422), (b"\x00\xff\xfe", 422), (b'{"spec": 42}', 422), (b"[]", 422),
        (b'{"spec": "' + b"[" * 20_000 + b'"}', 422), (b"[" * 20_000 + b"]" * 20_000, 422),
        (json.dumps({"spec": "#" * (MAX_BODY_BYTES + 10)}).encode(), 413),
        (json.dumps({"spec": CHAIN, "source": "etl\x00.yaml"}).encode(), 422),
    ]
    for body, expected in cases:
        response = api.client.post("/v1/pipelines", content=body, headers=headers)
        assert response.status_code == expected, (body[:40], response.text[:300])
        assert "Traceback" not in response.text
    assert _stored(api) == 0
