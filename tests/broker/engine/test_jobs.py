"""A start that fails is tried again a bounded number of times, then the job FAILS with the error
and its clusters go down: on the local backend, with real cluster hosts and node agents."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from sqlalchemy import select

from broker.config.settings import load_settings
from broker.engine import Engine
from broker.model import JobState
from broker.runtime import Runtime, assemble
from broker.spec.job import parse_job_spec
from broker.status.orm_source import job_summary
from broker.store.tables import AllocationRow, ClusterRow, JobEventRow, JobRow
from providers.base import SpotQuote
from providers.trace import write_trace


def _trace(path: Path) -> Path:
    start = datetime(2026, 1, 1, tzinfo=UTC)
    write_trace(path, [SpotQuote("aws", "us-east-1", "us-east-1a", "p3.2xlarge", "V100", 1, 0.9, 3.06,
                                 start + timedelta(minutes=m), available_nodes=4) for m in range(600)])
    return path


def _broker(tmp_path: Path, **settings: Any) -> tuple[Runtime, Engine]:
    loaded = load_settings(market=_trace(tmp_path / "market.csv"), speed=60.0, local_provision_seconds=30.0,
                           **settings)
    broker = assemble(loaded, fresh_market=True)
    return broker, broker.start()


def _job(tmp_path: Path, setup: str, run: str = "echo the run began") -> Any:
    text = f"name: starts\nresources:\n  accelerators: V100:1\nworkdir: {tmp_path}\nsetup: {json.dumps(setup)}\n" \
           f"run: {json.dumps(run)}\n"
    return parse_job_spec(text, source=str(tmp_path / "job.yaml"))


def _step_until(engine: Engine, job_id: str, done: Any, timeout: float = 120) -> JobRow:
    deadline = time.time() + timeout
    while time.time() < deadline:
        engine.step()  # a failing start never escapes the step
        with engine.store.transaction() as s:
            job = s.get(JobRow, job_id)
            assert job is not None
            if done(s, job):
                return job
        time.sleep(0.05)
    raise AssertionError(f"{job_id} never got there")


def _terminal(s: Any, job: JobRow) -> bool:
    return JobState(job.state).terminal


def _all_down(broker: Runtime, engine: Engine, job_id: str) -> list[ClusterRow]:
    def down(s: Any, job: JobRow) -> bool:
        rows = list(s.scalars(select(ClusterRow).where(ClusterRow.job_id == job_id)))
        return bool(rows) and all(r.state in ("TERMINATED", "FAILED") for r in rows)

    _step_until(engine, job_id, down, timeout=60)
    with engine.store.transaction() as s:
        rows = list(s.scalars(select(ClusterRow).where(ClusterRow.job_id == job_id)))
    for row in rows:  # and the local cloud agrees: its hosts ended them
        status = json.loads((broker.settings.home / "local" / "clusters" / row.id / "status.json").read_text())
        assert status["state"] in ("TERMINATED", "FAILED"), status
    return rows


def test_a_setup_that_exits_1_is_retried_then_the_job_fails_with_it(tmp_path: Path) -> None:
    broker, engine = _broker(tmp_path, start_retries=2)
    try:
        job_id = engine.submit(_job(tmp_path, "echo preparing; exit 3"))
        job = _step_until(engine, job_id, _terminal)
        assert job.state == "FAILED"
        assert job.reason == "could not start (3 tries): node-0: setup exited with code 3"
        rows = _all_down(broker, engine, job_id)
        assert len(rows) == 1 and rows[0].teardown_reason == "idle"  # the same nodes, tried three times
        with engine.store.transaction() as s:
            tries = list(s.scalars(select(JobEventRow).where(JobEventRow.job_id == job_id,
                                                             JobEventRow.kind == "start_failed")))
            allocations = list(s.scalars(select(AllocationRow).where(AllocationRow.job_id == job_id)))
            summary = job_summary(s, s.get(JobRow, job_id))  # type: ignore[arg-type]
        assert [e.detail["tries"] for e in tries] == [1, 2, 3]
        assert [a.outcome for a in allocations] == ["start_failed"] * 3
        assert all(a.ended_at is not None for a in allocations)
        assert summary["reason"] == job.reason
        logs = sorted((broker.settings.home / "logs" / job_id).glob("attempt-*-node-0.log"))
        assert len(logs) == 3 and all("preparing" in p.read_text() for p in logs)
        assert not any("the run began" in p.read_text() for p in logs)
        shown = subprocess.run([sys.executable, "-m", "broker", "status", job_id], capture_output=True, text=True,
                               timeout=120, env={**os.environ, "BROKER_HOME": str(broker.settings.home)})
        assert shown.returncode == 0, shown.stderr
        assert f"{job_id} FAILED: could not start (3 tries): node-0: setup exited with code 3" in shown.stdout
    finally:
        broker.close()


def test_a_setup_that_fails_once_is_retried_and_the_job_runs(tmp_path: Path) -> None:
    broker, engine = _broker(tmp_path, start_retries=1)
    marker = tmp_path / "tried-once"
    try:
        job_id = engine.submit(_job(tmp_path, f"test -f {marker} || {{ touch {marker}; exit 1; }}"))
        job = _step_until(engine, job_id, _terminal)
        assert job.state == "SUCCEEDED", job.reason
        assert job.attempt == 2 and job.reason is None
        rows = _all_down(broker, engine, job_id)
        assert len(rows) == 1
        assert "the run began" in (broker.settings.home / "logs" / job_id / "attempt-2-node-0.log").read_text()
    finally:
        broker.close()


def test_a_node_that_refuses_the_start_fails_the_job_and_no_step_raises(tmp_path: Path) -> None:
    broker, engine = _broker(tmp_path, start_retries=1)
    try:
        job_id = engine.submit(_job(tmp_path, "true"))

        def launched(s: Any, job: JobRow) -> bool:
            return job.target_cluster_id is not None

        cluster_id = _step_until(engine, job_id, launched).target_cluster_id
        # The node's disk will not take the run's directory: every start raises in the provisioner.
        (broker.settings.home / "local" / "clusters" / str(cluster_id) / "runs").write_text("not a directory")
        job = _step_until(engine, job_id, _terminal)
        assert job.state == "FAILED"
        assert job.reason is not None and job.reason.startswith("could not start (2 tries): ")
        assert "Error" in job.reason and "runs" in job.reason
        _all_down(broker, engine, job_id)
    finally:
        broker.close()


def test_no_retries_fails_on_the_first_failed_start(tmp_path: Path) -> None:
    broker, engine = _broker(tmp_path, start_retries=0)
    try:
        job_id = engine.submit(_job(tmp_path, "exit 1"))
        job = _step_until(engine, job_id, _terminal)
        assert job.state == "FAILED" and job.reason == "could not start (1 try): node-0: setup exited with code 1"
        assert job.attempt == 1
    finally:
        broker.close()
