"""The job state machine: every change checked, stamped with the market's clock, and told why."""

from __future__ import annotations

import math
import time
from pathlib import Path

import pytest
from alembic import command
from sqlalchemy import inspect, select

from broker.clock import AcceleratedClock
from broker.engine import machine
from broker.engine.clusters import IllegalClusterTransition, release
from broker.model import CheckpointReason, ClusterState, IllegalTransition, JobState, TeardownReason
from broker.spec.job import parse_job_spec
from broker.store import Store, open_store
from broker.store.db import alembic_config
from broker.store.tables import ClusterRow, JobEventRow, JobRow

JOB = """\
name: machine
num_nodes: 1
resources:
  accelerators: V100:1
run: python train.py
"""

# A replay begun a day ago at twice wall speed: its clock runs a day (and then some) ahead of the wall's.
MARKET = AcceleratedClock(time.time() - 86400.0, 2.0)


@pytest.fixture
def store(db_url: str) -> Store:
    return open_store(db_url)


def _submit(store: Store, home: Path) -> str:
    return machine.submit_job(store, MARKET, parse_job_spec(JOB, offline=True), home, "local")


def _events(store: Store, job_id: str) -> list[JobEventRow]:
    with store.transaction() as s:
        return list(s.scalars(select(JobEventRow).where(JobEventRow.job_id == job_id).order_by(JobEventRow.id)))


def test_checkpointing_records_why_and_leaving_it_clears_the_reason(store: Store, broker_home: Path) -> None:
    job_id = _submit(store, broker_home)
    with store.transaction() as s:
        job = s.get(JobRow, job_id)
        assert job is not None
        machine.provisioning(s, MARKET, job)
        machine.running(s, MARKET, job)
        machine.checkpointing(s, MARKET, job, CheckpointReason.NOTICE, notice="terminate")
    with store.transaction() as s:
        job = s.get(JobRow, job_id)
        assert job is not None and job.state == JobState.CHECKPOINTING and job.checkpoint_reason == "notice"
        machine.migrating(s, MARKET, job)
    with store.transaction() as s:
        job = s.get(JobRow, job_id)
        assert job is not None and job.state == JobState.MIGRATING and job.checkpoint_reason is None
    last = _events(store, job_id)[-2]
    assert (last.to_state, last.detail["checkpoint_reason"]) == ("CHECKPOINTING", "notice")


def test_a_preemption_with_unbounded_gain_is_recorded(store: Store, broker_home: Path) -> None:
    """A preemptor whose wait is unbounded (no running job has a work estimate) gains ``inf`` GPU-seconds:
    PostgreSQL's json refuses the bare ``Infinity`` token, which stopped every engine step there."""
    job_id = _submit(store, broker_home)
    with store.transaction() as s:
        job = s.get(JobRow, job_id)
        assert job is not None
        machine.provisioning(s, MARKET, job, preempting=["j-other"], work_lost_gpu_s=12.5, gain_gpu_s=math.inf)
    last = _events(store, job_id)[-1]
    assert (last.to_state, last.detail["gain_gpu_s"], last.detail["work_lost_gpu_s"]) == ("PROVISIONING", "inf", 12.5)


def test_an_illegal_transition_is_refused_and_nothing_changes(store: Store, broker_home: Path) -> None:
    job_id = _submit(store, broker_home)
    with pytest.raises(IllegalTransition), store.transaction() as s:
        job = s.get(JobRow, job_id)
        assert job is not None
        machine.checkpointing(s, MARKET, job, CheckpointReason.MOVE)
    with store.transaction() as s:
        job = s.get(JobRow, job_id)
        assert job is not None and job.state == JobState.PENDING and job.checkpoint_reason is None


def test_cancel_goes_through_the_machine_on_market_time(store: Store, broker_home: Path) -> None:
    job_id = _submit(store, broker_home)
    market = AcceleratedClock(time.time() - 86400.0, 2.0)  # a day ahead of the wall's, from now
    assert machine.cancel_job(store, job_id, market) == "CANCELLED"
    assert machine.cancel_job(store, job_id, market) == "CANCELLED"  # once cancelled, it stays so
    with store.transaction() as s:
        job = s.get(JobRow, job_id)
        assert job is not None and job.finished_at is not None and job.wall_finished_at is not None
        # Stamped with the replay's clock, a day ahead of the wall's, like every other transition.
        assert (job.finished_at - job.wall_finished_at).total_seconds() == pytest.approx(86400.0, abs=60.0)
    (cancelled,) = [e for e in _events(store, job_id) if e.to_state == "CANCELLED"]
    assert cancelled.from_state == "PENDING" and cancelled.detail == {"reason": "cancelled by user"}
    with pytest.raises(machine.UnknownJob, match="no job 'j-nothere'"):
        machine.cancel_job(store, "j-nothere", market)


def test_a_cluster_says_why_it_goes_and_cannot_come_back(store: Store, broker_home: Path) -> None:
    job_id = _submit(store, broker_home)
    now = MARKET.now()
    with store.transaction() as s:
        row = ClusterRow(id="c1", launch_key="c1", job_id=job_id, backend="local", cloud="aws", region="r",
                         zone="z", instance_type="p3.2xlarge", gpus_per_node=1, num_nodes=1, spot=True,
                         price_per_node_hour=1.0, on_demand_price_per_node_hour=3.0,
                         state=ClusterState.UP.value, handle={}, created_at=now)
        s.add(row)
        release(row, now, TeardownReason.IDLE)
        release(row, now, TeardownReason.REPLACED)  # already going: the first reason stands
        assert (row.state, row.teardown_reason) == ("TERMINATING", "idle")
        row.state = ClusterState.TERMINATED.value
        with pytest.raises(IllegalClusterTransition, match="cannot move from TERMINATED to TERMINATING"):
            release(row, now, TeardownReason.IDLE)


def test_the_reasons_migration_upgrades_and_downgrades(db_url: str) -> None:
    store = open_store(db_url)
    with store.engine.begin() as conn:
        config = alembic_config(db_url)
        config.attributes["connection"] = conn
        command.downgrade(config, "0002_tokens")
    columns = {c["name"] for c in inspect(store.engine).get_columns("jobs")}
    assert "checkpoint_reason" not in columns and "checkpoint_requested_at" in columns
    store.dispose()
    store = open_store(db_url)  # back to head
    assert "checkpoint_reason" in {c["name"] for c in inspect(store.engine).get_columns("jobs")}
    assert "teardown_reason" in {c["name"] for c in inspect(store.engine).get_columns("clusters")}
    store.dispose()
