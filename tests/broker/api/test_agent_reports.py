"""``POST /v1/checkpoints``: agents report complete checkpoints; only their own job's, only while up."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import pytest
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy import func, select

from broker.api.app import create_app
from broker.clock import WallClock
from broker.engine import checkpoint_reports as checkpoints
from broker.store import Store, open_store
from broker.store.tables import AllocationRow, CheckpointReportRow, ClusterRow, JobRow, ProgressRow
from broker.tokens import token_digest

AUTH = {"Authorization": "Bearer token-one"}


@pytest.fixture
def store(db_url: str) -> Store:
    store = open_store(db_url)
    now = datetime.now(UTC)
    with store.transaction() as s:
        for job_id in ("j1", "j2"):
            s.add(JobRow(id=job_id, name="t", team="a", state="RUNNING", priority=500, spec={}, backend="local",
                         num_nodes=1, gpus_per_node=1, checkpoint_dir=f"s3://bucket/{job_id}", created_at=now,
                         updated_at=now, zones=[]))
        s.flush()
        for cluster_id, token, job_id in (("c1", "token-one", "j1"), ("c2", "token-two", "j2")):
            s.add(ClusterRow(id=cluster_id, launch_key=cluster_id, job_id=job_id, backend="local", cloud="aws",
                             region="r", zone="z", instance_type="p3.2xlarge", gpus_per_node=1, num_nodes=1,
                             spot=True, price_per_node_hour=1.0, on_demand_price_per_node_hour=3.0, state="UP",
                             token_hash=token_digest(token), handle={}, created_at=now))
            s.flush()
            s.add(AllocationRow(job_id=job_id, cluster_id=cluster_id, attempt=1, gpus={"0": [0]}, started_at=now))
    return store


def _report(**extra: object) -> dict[str, object]:
    return {"job_id": "j1", "cluster_id": "c1", "node": "0", "path": "step-000120.npz",
            "written_at": datetime.now(UTC).isoformat(), "step": 120, **extra}


def _rows(store: Store) -> list[CheckpointReportRow]:
    with store.transaction() as s:
        return list(s.scalars(select(CheckpointReportRow).order_by(CheckpointReportRow.id)))


def _count(store: Store) -> int:
    with store.transaction() as s:
        return int(s.scalar(select(func.count()).select_from(CheckpointReportRow)) or 0)


def test_a_report_is_stored_once_relative_to_the_checkpoint_dir(store: Store) -> None:
    client = TestClient(create_app(store, WallClock()))
    first = client.post("/v1/checkpoints", json=_report(), headers=AUTH)
    again = client.post("/v1/checkpoints", json=_report(node="1"), headers=AUTH)
    assert first.status_code == again.status_code == 202
    assert (first.json()["duplicate"], again.json()["duplicate"]) == (False, True)
    [row] = _rows(store)
    assert (row.job_id, row.cluster_id, row.path, row.step) == ("j1", "c1", "step-000120.npz", 120)
    with store.transaction() as s:
        job = s.get(JobRow, "j1")
        assert job is not None
        newest = checkpoints.newest(s, job)
        assert newest is not None
        assert checkpoints.resolve(job.checkpoint_dir, newest.path) == "s3://bucket/j1/step-000120.npz"


def test_the_save_time_the_job_measured_is_stored(store: Store) -> None:
    client = TestClient(create_app(store, WallClock()))
    assert client.post("/v1/checkpoints", json=_report(save_seconds=2.5), headers=AUTH).status_code == 202
    assert client.post("/v1/checkpoints", json=_report(path="older-agent"), headers=AUTH).status_code == 202
    assert [row.save_seconds for row in _rows(store)] == [2.5, None]


def test_newest_is_by_the_time_the_checkpoint_was_written(store: Store) -> None:
    client = TestClient(create_app(store, WallClock()))
    now = datetime.now(UTC)
    client.post("/v1/checkpoints", json=_report(path="b", written_at=(now - timedelta(seconds=5)).isoformat()),
                headers=AUTH)
    client.post("/v1/checkpoints", json=_report(path="a", written_at=now.isoformat()), headers=AUTH)
    with store.transaction() as s:
        job = s.get(JobRow, "j1")
        assert job is not None
        newest = checkpoints.newest(s, job)
        assert newest is not None and newest.path == "a"
        assert checkpoints.newest(s, job, since=now + timedelta(seconds=1)) is None


def test_the_token_is_checked_before_the_body(store: Store) -> None:
    client = TestClient(create_app(store, WallClock()))
    for headers in ({}, {"Authorization": "Bearer nope"}):
        response = client.post("/v1/checkpoints", content=b"{not json", headers=headers)
        assert response.status_code == 401, response.text
        assert "loc" not in response.text
    assert _count(store) == 0


def test_a_token_reports_only_for_its_own_cluster_and_job(store: Store) -> None:
    client = TestClient(create_app(store, WallClock()))
    other_cluster = client.post("/v1/checkpoints", json=_report(cluster_id="c2"), headers=AUTH)
    other_job = client.post("/v1/checkpoints", json=_report(job_id="j2"), headers=AUTH)
    assert other_cluster.status_code == 403
    assert other_job.status_code == 422 and "job_id" in json.dumps(other_job.json())
    assert _count(store) == 0


def test_a_terminated_clusters_token_is_refused(store: Store) -> None:
    with store.transaction() as s:
        cluster = s.get(ClusterRow, "c1")
        assert cluster is not None
        cluster.state, cluster.terminated_at = "TERMINATED", datetime.now(UTC)
    response = TestClient(create_app(store, WallClock())).post("/v1/checkpoints", json=_report(), headers=AUTH)
    assert response.status_code == 401
    assert _count(store) == 0


@pytest.mark.parametrize(("field", "value"), [
    ("path", "/etc/passwd"),
    ("path", "../other-job/step-1"),
    ("path", "a/../../x"),
    ("path", "s3://elsewhere/x"),
    ("path", "ok\x00nul"),
    ("path", "x" * 5000),
    ("path", ""),
    ("path", "."),
    ("job_id", "j1\x00"),
    ("node", "n" * 101),
    ("step", -1),
    ("step", 10**23),
    ("step", 2**62 + 1),
    ("written_at", "9999-12-31T23:59:59Z"),
    ("written_at", "2030-13-45T00:00:00Z"),
    ("written_at", "garbage"),
    ("save_seconds", -0.5),
    ("save_seconds", 1e12),
    ("save_seconds", float("nan")),
    ("save_seconds", float("inf")),
    ("save_seconds", "fast"),
])
def test_hostile_fields_are_refused_naming_the_field(store: Store, field: str, value: object) -> None:
    body = json.dumps(_report(**{field: value}))  # NaN and Infinity as Python's json writes them
    response = TestClient(create_app(store, WallClock())).post(
        "/v1/checkpoints", content=body, headers={**AUTH, "Content-Type": "application/json"})
    assert 400 <= response.status_code < 500, response.text
    assert field in json.dumps(response.json())
    assert _count(store) == 0


def test_huge_and_deep_bodies_are_refused(store: Store) -> None:
    client = TestClient(create_app(store, WallClock()))
    huge = client.post("/v1/checkpoints", content=b'{"path": "' + b"x" * 10_000_000 + b'"}', headers=AUTH)
    deep = client.post("/v1/checkpoints", content=b"[" * 20_000 + b"]" * 20_000, headers=AUTH)
    assert huge.status_code == 413
    assert 400 <= deep.status_code < 500
    assert _count(store) == 0


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(body=st.recursive(st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False)
                         | st.text(),
                         lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner,
                                                                                     max_size=4), max_leaves=20))
def test_no_body_makes_a_server_error(store: Store, body: object) -> None:
    response = TestClient(create_app(store, WallClock())).post("/v1/checkpoints", json=body, headers=AUTH)
    assert response.status_code < 500


def _progress(**extra: object) -> dict[str, object]:
    return {"job_id": "j1", "cluster_id": "c1", "node": "0", "step": 120, "total": 400,
            "at": datetime.now(UTC).isoformat(), **extra}


def _progress_rows(store: Store) -> list[ProgressRow]:
    with store.transaction() as s:
        return list(s.scalars(select(ProgressRow).order_by(ProgressRow.id)))


def test_progress_is_recorded_for_the_running_attempt(store: Store) -> None:
    client = TestClient(create_app(store, WallClock()))
    assert client.post("/v1/progress", json=_progress(), headers=AUTH).status_code == 202
    assert client.post("/v1/progress", json=_progress(step=2**62, total=None), headers=AUTH).status_code == 202
    assert [(r.job_id, r.step, r.total) for r in _progress_rows(store)] == [("j1", 120, 400), ("j1", 2**62, None)]


def test_progress_needs_the_token_first_and_a_job_running_on_that_cluster(store: Store) -> None:
    client = TestClient(create_app(store, WallClock()))
    assert client.post("/v1/progress", content=b"garbage").status_code == 401
    assert client.post("/v1/progress", json=_progress(job_id="j2"), headers=AUTH).status_code == 422
    with store.transaction() as s:
        for alloc in s.scalars(select(AllocationRow)):
            alloc.ended_at = datetime.now(UTC)
    assert client.post("/v1/progress", json=_progress(), headers=AUTH).status_code == 422
    assert _progress_rows(store) == []


@pytest.mark.parametrize(("field", "value"), [
    ("step", -1), ("step", 2**62 + 1), ("step", "twelve"), ("step", None), ("total", 0), ("total", 10**30),
    ("at", "9999-12-31T23:59:59Z"), ("at", "nope"), ("job_id", "x" * 33), ("node", "\x00"),
])
def test_hostile_progress_is_refused_naming_the_field(store: Store, field: str, value: object) -> None:
    response = TestClient(create_app(store, WallClock())).post("/v1/progress", json=_progress(**{field: value}),
                                                              headers=AUTH)
    assert 400 <= response.status_code < 500, response.text
    assert field in json.dumps(response.json())
    assert _progress_rows(store) == []
