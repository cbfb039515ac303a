"""``POST /v1/gpu``: a node's GPU minutes, stored once, only for its own cluster's jobs; hostile bodies refused."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy import func, select

from broker.api.app import BackgroundServer, create_app
from broker.clock import WallClock
from broker.store import Store, open_store
from broker.store.gpu import GpuMinuteRow
from broker.store.tables import AllocationRow, ClusterRow, JobRow
from broker.tokens import token_digest
from tests.fakenvml import pynvml as fake

AUTH = {"Authorization": "Bearer token-one"}
FAKE_DIR = str(Path(fake.__file__).parent)


def _fill(store: Store) -> None:
    now = datetime.now(UTC)
    with store.transaction() as s:
        for job_id, team in (("j1", "a"), ("j2", "b")):
            s.add(JobRow(id=job_id, name="t", team=team, state="RUNNING", priority=500, spec={}, backend="local",
                         num_nodes=1, gpus_per_node=2, checkpoint_dir=f"/tmp/{job_id}", created_at=now,
                         updated_at=now, zones=[], attempt=1))
        s.flush()
        for cluster_id, token, job_id in (("c1", "token-one", "j1"), ("c2", "token-two", "j2")):
            s.add(ClusterRow(id=cluster_id, launch_key=cluster_id, job_id=job_id, backend="local", cloud="aws",
                             region="r", zone="z", instance_type="p3.8xlarge", gpus_per_node=2, num_nodes=1,
                             spot=True, price_per_node_hour=2.0, on_demand_price_per_node_hour=6.0, state="UP",
                             token_hash=token_digest(token), handle={}, created_at=now - timedelta(hours=1)))
            s.flush()
            s.add(AllocationRow(job_id=job_id, cluster_id=cluster_id, attempt=1, gpus={"0": [0, 1]},
                                started_at=now - timedelta(hours=1)))


@pytest.fixture
def store(db_url: str) -> Store:
    store = open_store(db_url)
    _fill(store)
    return store


@pytest.fixture(scope="module")
def shared_store(tmp_path_factory: pytest.TempPathFactory) -> Store:
    """One SQLite store for the hostile bodies: each is refused before the store is written, so they may share it."""
    store = open_store(f"sqlite:///{tmp_path_factory.mktemp('hostile') / 'store.db'}")
    _fill(store)
    return store


def _minute(**extra: Any) -> dict[str, Any]:
    at = datetime.now(UTC).replace(second=0, microsecond=0) - timedelta(minutes=2)
    return {"gpu": 0, "uuid": "GPU-aaaa", "minute": at.isoformat(), "samples": 12, "memory_total_mb": 81920.0,
            "utilization_mean": 3.0, "utilization_max": 8.0, "memory_used_mb_mean": 1000.0,
            "memory_used_mb_max": 1200.0, "power_w_mean": 60.0, "power_w_max": 70.0, **extra}


def _report(*minutes: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return {"job_id": "j1", "attempt": 1, "cluster_id": "c1", "node": "0",
            "minutes": list(minutes) or [_minute()], **extra}


def _count(store: Store) -> int:
    with store.transaction() as s:
        return int(s.scalar(select(func.count()).select_from(GpuMinuteRow)) or 0)


def test_a_report_is_stored_once_per_gpu_and_minute(store: Store) -> None:
    client = TestClient(create_app(store, WallClock()))
    body = _report(_minute(idle_samples=12), _minute(gpu=1, utilization_mean=95.0, utilization_max=100.0))
    first = client.post("/v1/gpu", json=body, headers=AUTH)
    assert first.status_code == 202 and first.json() == {"stored": 2, "duplicates": 0}
    again = client.post("/v1/gpu", json=body, headers=AUTH)
    assert again.json() == {"stored": 0, "duplicates": 2}
    with store.transaction() as s:
        rows = list(s.scalars(select(GpuMinuteRow).order_by(GpuMinuteRow.gpu)))
    assert [(r.gpu, r.idle_samples, r.utilization_mean, r.memory_used_mb_max, r.power_w_mean) for r in rows] == [
        (0, 12, 3.0, 1200.0, 60.0), (1, None, 95.0, 1200.0, 60.0)]
    assert all((r.ended_at - r.started_at) == timedelta(minutes=1) and r.attributed_at is None for r in rows)
    assert [r.seconds for r in rows] == [60.0, 60.0]  # inside the allocation, over before it was received


def _huge_list() -> list[dict[str, Any]]:
    return [_minute(gpu=i % 1000) for i in range(600)]


@pytest.mark.parametrize(("body", "field"), [
    (b"not json", "body"),
    (b"\x00\xff", "body"),
    (b"[]", "body"),
    (json.dumps(_report(job_id="j1\x00")).encode(), "job_id"),
    (json.dumps(_report(job_id="\ud800")).encode(), "body"),  # a lone surrogate is not JSON
    (json.dumps(_report(attempt=-1)).encode(), "attempt"),
    (json.dumps(_report(minutes=[])).encode(), "minutes"),
    (json.dumps(_report(minutes=_huge_list())).encode(), "minutes"),
    (json.dumps(_report(_minute(utilization_mean=-3.0))).encode(), "utilization_mean"),
    (json.dumps(_report(_minute(utilization_max=101.0))).encode(), "utilization_max"),
    (json.dumps(_report(_minute(utilization_mean=50.0, utilization_max=20.0))).encode(), "utilization_mean"),
    (json.dumps(_report(_minute(power_w_mean=math.nan))).encode(), "power_w_mean"),
    (json.dumps(_report(_minute(power_w_max=math.inf))).encode(), "power_w_max"),
    (json.dumps(_report(_minute(memory_used_mb_max=1e30))).encode(), "memory_used_mb_max"),
    (json.dumps(_report(_minute(memory_used_mb_max=90000.0))).encode(), "memory_used_mb_max"),
    (json.dumps(_report(_minute(samples=0))).encode(), "samples"),
    (json.dumps(_report(_minute(idle_samples=13))).encode(), "idle_samples"),
    (json.dumps(_report(_minute(idle_samples=-1))).encode(), "idle_samples"),
    (json.dumps(_report(_minute(idle_samples=2**70))).encode(), "idle_samples"),
    (json.dumps(_report(_minute(idle_samples="3\x00"))).encode(), "idle_samples"),
    (json.dumps(_report(_minute(idle_samples=2.5))).encode(), "idle_samples"),
    (json.dumps(_report(_minute(gpu=2**40))).encode(), "gpu"),
    (json.dumps(_report(_minute(minute="9999-01-01T00:00:00+00:00"))).encode(), "minute"),
    (json.dumps(_report(_minute(minute="2001-01-01T00:00:00+00:00"))).encode(), "minute"),
    (json.dumps(_report(_minute(uuid="GPU-<script>"))).encode(), "uuid"),
    (json.dumps(_report(_minute(extra_figure=1.0))).encode(), "extra_figure"),
    (b'{"job_id": "j1", "attempt": 1, "cluster_id": "c1", "minutes": ' + b"[" * 3000 + b"]" * 3000 + b"}", "body"),
])
def test_hostile_reports_are_refused_whole_naming_the_field(shared_store: Store, body: bytes, field: str) -> None:
    store = shared_store
    client = TestClient(create_app(store, WallClock()))
    before = _count(store)
    response = client.post("/v1/gpu", content=body, headers={**AUTH, "Content-Type": "application/json"})
    assert 400 <= response.status_code < 500, response.text
    text = response.text
    assert field in text and "Traceback" not in text
    assert _count(store) == before


def test_only_its_own_cluster_s_running_job(store: Store) -> None:
    client = TestClient(create_app(store, WallClock()))
    assert client.post("/v1/gpu", json=_report()).status_code == 401
    assert client.post("/v1/gpu", json=_report(), headers={"Authorization": "Bearer wrong"}).status_code == 401
    other_team = client.post("/v1/gpu", json=_report(job_id="j2", cluster_id="c2"), headers=AUTH)
    assert other_team.status_code == 403 and "cluster_id" in other_team.text
    not_here = client.post("/v1/gpu", json=_report(job_id="j2"), headers=AUTH)
    assert not_here.status_code == 422 and "job_id" in not_here.text
    old_attempt = client.post("/v1/gpu", json=_report(attempt=7), headers=AUTH)
    assert old_attempt.status_code == 422
    before = datetime.now(UTC).replace(second=0, microsecond=0) - timedelta(hours=3)
    early = client.post("/v1/gpu", json=_report(_minute(minute=before.isoformat())), headers=AUTH)
    assert early.status_code == 422 and "outside the job's run" in early.text
    assert _count(store) == 0


JOB = "import time\nfor _ in range(100):\n    time.sleep(0.02)\n"


def test_an_agent_with_the_stand_in_first_on_its_path_reports_to_the_real_api(tmp_path: Path) -> None:
    store = open_store(f"sqlite:///{tmp_path / 'store.db'}")
    _fill(store)
    readings = tmp_path / "readings.json"
    readings.write_text(json.dumps({"devices": [
        {"uuid": "GPU-aaaa", "memory_total_mb": 81920, "readings": [{"gpu": 3, "memory": 1, "used_mb": 900}]},
        {"uuid": "GPU-bbbb", "memory_total_mb": 81920, "unsupported": ["power"],
         "readings": [{"gpu": 97, "memory": 60, "used_mb": 70000}]}]}))
    job = tmp_path / "job.py"
    job.write_text(JOB)
    server = BackgroundServer(create_app(store, WallClock())).start()
    try:
        env = {**os.environ, "BROKER_JOB_ID": "j1", "BROKER_ATTEMPT": "1", "BROKER_AGENT_TOKEN": "token-one",
               "CUDA_VISIBLE_DEVICES": "0,1", "FAKE_NVML_READINGS": str(readings),
               "PYTHONPATH": os.pathsep.join([FAKE_DIR, os.environ.get("PYTHONPATH", "")])}
        result = subprocess.run(
            [sys.executable, "-m", "broker.agent", "--cloud", "local", "--poll", "50ms", "--cluster-id", "c1",
             "--broker-url", server.url, "--gpu-sample", "20ms", "--status-file", str(tmp_path / "status"),
             "--", sys.executable, str(job)], env=env, timeout=60, capture_output=True)
    finally:
        server.stop()
    assert result.returncode == 0, result.stderr.decode()[-2000:]
    with store.transaction() as s:
        rows = list(s.scalars(select(GpuMinuteRow).order_by(GpuMinuteRow.started_at, GpuMinuteRow.gpu)))
    assert {r.gpu for r in rows} == {0, 1}
    by_gpu = {r.gpu: r for r in rows}
    assert (by_gpu[0].utilization_mean, by_gpu[0].memory_used_mb_max, by_gpu[0].uuid) == (3.0, 900.0, "GPU-aaaa")
    assert (by_gpu[1].utilization_max, by_gpu[1].power_w_mean) == (97.0, None)  # "not supported": no figure
    assert sum(r.samples for r in rows) >= 2
    # The broker's threshold (none sent: the default 10 %): GPU 0 at 3 % idle in every sample, GPU 1 at 97 % in none.
    assert all(r.idle_samples == (r.samples if r.gpu == 0 else 0) for r in rows)
    assert all(0 < r.seconds <= 60 for r in rows)  # clipped to when each minute came in


def test_an_agent_on_a_node_without_nvml_says_so_once_and_the_job_runs(tmp_path: Path) -> None:
    readings = tmp_path / "readings.json"
    readings.write_text(json.dumps({"init_error": 12}))
    job = tmp_path / "job.py"
    job.write_text("print('trained', flush=True)\n")
    env = {**os.environ, "BROKER_JOB_ID": "j1", "BROKER_AGENT_TOKEN": "token-one", "FAKE_NVML_READINGS": str(readings),
           "PYTHONPATH": os.pathsep.join([FAKE_DIR, os.environ.get("PYTHONPATH", "")])}
    result = subprocess.run(
        [sys.executable, "-m", "broker.agent", "--cloud", "local", "--poll", "50ms", "--cluster-id", "c1",
         "--broker-url", "http://127.0.0.1:9", "--gpu-sample", "20ms", "--", sys.executable, str(job)],
        env=env, timeout=60, capture_output=True)
    assert result.returncode == 0 and b"trained" in result.stdout
    assert result.stderr.decode().count("gpu_sampling_unavailable") == 1
    assert "NVML Shared Library Not Found" in result.stderr.decode()


_values = st.one_of(st.none(), st.booleans(), st.integers(min_value=-(2**70), max_value=2**70),
                    st.floats(allow_nan=False, allow_infinity=False), st.text(max_size=30),
                    st.lists(st.integers(), max_size=3),
                    st.dictionaries(st.text(max_size=5), st.integers(), max_size=2))
_fields = ("gpu", "uuid", "minute", "samples", "idle_samples", "utilization_mean", "utilization_max",
           "memory_used_mb_max", "memory_total_mb", "power_w_mean", "job_utilization_mean")


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(changes=st.dictionaries(st.sampled_from(_fields), _values, max_size=4),
       top=st.dictionaries(st.sampled_from(("job_id", "attempt", "cluster_id", "node")), _values, max_size=2))
def test_fuzzed_reports_never_5xx_and_store_only_what_was_accepted(shared_store: Store, changes: dict[str, Any],
                                                                   top: dict[str, Any]) -> None:
    client = TestClient(create_app(shared_store, WallClock()))
    body = _report(_minute(**changes), **top)
    before = _count(shared_store)
    response = client.post("/v1/gpu", content=json.dumps(body), headers={**AUTH, "Content-Type": "application/json"})
    assert response.status_code < 500, response.text
    stored = response.json()["stored"] if response.status_code == 202 else 0
    assert _count(shared_store) == before + stored
