"""Eager allocation on the local backend, with real training processes: wrong predictions must not hurt."""

from __future__ import annotations

from datetime import datetime, timedelta
from pathlib import Path

import pytest
from sqlalchemy import select

from broker.config.settings import load_settings
from broker.engine import Engine, machine, packing
from broker.runtime import Runtime, assemble
from broker.spec.job import parse_job_spec
from broker.store.tables import AllocationRow, ClusterRow, JobEventRow, PredictionRow
from tests.broker.engine.one_zone import job_row, one_zone_market, run_until

EXAMPLES = Path(__file__).resolve().parents[3] / "examples"

JOB = """\
name: {name}
num_nodes: {nodes}
resources:
  accelerators: V100:4
workdir: {workdir}
run: {run}
broker:
  work: {work}
"""
TRAIN = "python train.py --steps {steps} --step-seconds 0.05 --checkpoint-every 50"


def _broker(tmp_path: Path, max_gpus: int, pool_idle_s: float = 0.0) -> Runtime:
    path = tmp_path / "m.csv"
    one_zone_market(path, 4)
    settings = load_settings(market=path, speed=30.0, local_provision_seconds=60.0, max_gpus=max_gpus,
                             eager_policy="eager", eager_lead_seconds=3600.0, pool_idle_seconds=pool_idle_s)
    return assemble(settings, fresh_market=True)


def _submit(engine: Engine, tmp_path: Path, name: str, run: str, work: str = "1m", nodes: int = 1) -> str:
    text = JOB.format(name=name, nodes=nodes, workdir=EXAMPLES, run=run, work=work)
    return engine.submit(parse_job_spec(text, source=str(tmp_path / f"{name}.yaml")))



def _cluster_of(engine: Engine, job_id: str) -> str:
    with engine.store.transaction() as s:
        return str(s.scalar(select(AllocationRow.cluster_id).where(AllocationRow.job_id == job_id)))


def _events(engine: Engine, job_id: str, kind: str) -> list[JobEventRow]:
    with engine.store.transaction() as s:
        rows = list(s.scalars(select(JobEventRow).where(JobEventRow.job_id == job_id, JobEventRow.kind == kind)))
        for row in rows:
            s.expunge(row)
        return rows


@pytest.mark.slow
def test_a_job_running_past_its_predicted_finish_keeps_its_gpus_and_the_next_job_waits(tmp_path: Path) -> None:
    broker = _broker(tmp_path, max_gpus=4)
    engine = broker.start()
    try:
        # It says a minute of work; it runs about ten (600 steps of 0.05 wall s at 30x).
        a = _submit(engine, tmp_path, "a", TRAIN.format(steps=600), work="1m")
        run_until(engine, lambda: job_row(engine, a).state == "RUNNING")
        b = _submit(engine, tmp_path, "b", TRAIN.format(steps=40))
        run_until(engine, lambda: bool(_events(engine, b, "eager_reserve")))
        reserve = _events(engine, b, "eager_reserve")[0]
        predicted = datetime.fromisoformat(str(reserve.detail["predicted_finish"]))
        run_until(engine, lambda: engine.clock.now() > predicted + timedelta(seconds=60))
        # Past its predicted finish: a still holds its GPUs, b waits for them, nothing else was launched.
        assert job_row(engine, a).state == "RUNNING" and job_row(engine, b).state == "PROVISIONING"
        with engine.store.transaction() as s:
            assert s.scalar(select(AllocationRow).where(AllocationRow.job_id == b)) is None
            assert len(list(s.scalars(select(ClusterRow)))) == 1
            assert s.scalar(select(PredictionRow).where(PredictionRow.job_id == a)) is not None
        run_until(engine, lambda: job_row(engine, b).state in ("SUCCEEDED", "FAILED"))
        with engine.store.transaction() as s:
            allocs = {x.job_id: x for x in s.scalars(select(AllocationRow))}
        assert job_row(engine, a).state == job_row(engine, b).state == "SUCCEEDED"
        assert allocs[b].cluster_id == allocs[a].cluster_id and allocs[b].started_at >= allocs[a].ended_at
        log = (broker.settings.home / "logs" / a / "attempt-1-node-0.log").read_text()
        assert "done: 600 steps" in log  # never cut short for the job that reserved its GPUs
    finally:
        broker.close()


@pytest.mark.slow
def test_a_cancelled_reservation_is_released_and_a_failed_job_hands_its_gpus_on(tmp_path: Path) -> None:
    broker = _broker(tmp_path, max_gpus=4)
    engine = broker.start()
    try:
        a = _submit(engine, tmp_path, "a", TRAIN.format(steps=300) + "; exit 3")
        run_until(engine, lambda: job_row(engine, a).state == "RUNNING")
        b = _submit(engine, tmp_path, "b", TRAIN.format(steps=40))
        run_until(engine, lambda: bool(_events(engine, b, "eager_reserve")))
        cluster = job_row(engine, b).target_cluster_id
        assert cluster is not None
        machine.cancel_job(engine.store, b, engine.clock)
        with engine.store.transaction() as s:
            assert set(packing.claims(s, cluster)) == {a}  # b's claim went with it
        c = _submit(engine, tmp_path, "c", TRAIN.format(steps=40))
        run_until(engine, lambda: bool(_events(engine, c, "eager_reserve")))
        assert job_row(engine, c).target_cluster_id == cluster  # the released GPUs are reserved again
        run_until(engine, lambda: job_row(engine, c).state in ("SUCCEEDED", "FAILED"))
        assert job_row(engine, a).state == "FAILED" and job_row(engine, c).state == "SUCCEEDED"
        with engine.store.transaction() as s:
            allocs = {x.job_id: x for x in s.scalars(select(AllocationRow))}
        assert allocs[c].cluster_id == allocs[a].cluster_id and allocs[c].started_at >= allocs[a].ended_at
    finally:
        broker.close()


@pytest.mark.slow
def test_a_cluster_booted_early_for_a_job_then_cancelled_is_torn_down(tmp_path: Path) -> None:
    broker = _broker(tmp_path, max_gpus=8)
    engine = broker.start()
    try:
        a = _submit(engine, tmp_path, "a", TRAIN.format(steps=400))
        run_until(engine, lambda: job_row(engine, a).state == "RUNNING")
        # Two nodes: it fits neither a's one node nor the pool beside a; only once a's cluster goes.
        b = _submit(engine, tmp_path, "b", TRAIN.format(steps=40), nodes=2)
        run_until(engine, lambda: bool(_events(engine, b, "eager_boot")))
        boot = _events(engine, b, "eager_boot")[0]
        assert "boot now" in str(boot.detail["reason"]) and boot.detail["after_jobs"] == [a]
        assert boot.detail["leaving"] == [_cluster_of(engine, a)]
        early = str(boot.detail["cluster"])
        assert job_row(engine, a).state == "RUNNING"
        machine.cancel_job(engine.store, b, engine.clock)
        def gone() -> bool:
            with engine.store.transaction() as s:
                row = s.get(ClusterRow, early)
                return row is not None and row.state in ("TERMINATING", "TERMINATED")
        run_until(engine, gone)
        with engine.store.transaction() as s:
            row = s.get(ClusterRow, early)
            assert row is not None and row.teardown_reason == "idle"
        run_until(engine, lambda: job_row(engine, a).state in ("SUCCEEDED", "FAILED"))
        assert job_row(engine, a).state == "SUCCEEDED"
    finally:
        broker.close()


@pytest.mark.slow
def test_a_reservation_behind_a_job_running_late_is_given_up_for_other_gpus(tmp_path: Path) -> None:
    # The pool keeps an unheld cluster 10 market minutes, but not while a job waits on a reservation.
    broker = _broker(tmp_path, max_gpus=8, pool_idle_s=600.0)
    engine = broker.start()
    try:
        # a says a minute of work and runs about fifteen; c says thirty minutes and runs about one and a
        # half once b has reserved (it waits for that: on a loaded machine a step can outlast a fixed run,
        # and b would take c's idle cluster instead of reserving).
        b_reserved = tmp_path / "b-reserved"
        a = _submit(engine, tmp_path, "a", TRAIN.format(steps=600), work="1m")
        c = _submit(engine, tmp_path, "c", f"while [ ! -e {b_reserved} ]; do sleep 0.05; done; "
                    + TRAIN.format(steps=60), work="30m")
        run_until(engine, lambda: job_row(engine, a).state == job_row(engine, c).state == "RUNNING")
        b = _submit(engine, tmp_path, "b", TRAIN.format(steps=40))  # the pool is full: it reserves a's GPUs
        run_until(engine, lambda: bool(_events(engine, b, "eager_reserve")))
        b_reserved.touch()
        reserve = _events(engine, b, "eager_reserve")[0]
        assert reserve.detail["after_job"] == a
        a_cluster, c_cluster = _cluster_of(engine, a), _cluster_of(engine, c)
        run_until(engine, lambda: bool(_events(engine, b, "eager_give_up")))
        give_up = _events(engine, b, "eager_give_up")[0]
        assert give_up.detail["after_job"] == a and "give the reservation up" in str(give_up.detail["reason"])
        assert float(give_up.detail["overrun_s"]) > 0 or float(give_up.detail["slip_s"]) > 0
        run_until(engine, lambda: job_row(engine, b).state in ("SUCCEEDED", "FAILED"))
        # b ran on other GPUs while a, running late, kept its own and was never cut short.
        assert job_row(engine, b).state == "SUCCEEDED" and job_row(engine, a).state == "RUNNING"
        assert _cluster_of(engine, b) != a_cluster
        assert len(_events(engine, b, "eager_reserve")) == 1  # never reserved behind a again
        with engine.store.transaction() as s:
            a_alloc = s.scalar(select(AllocationRow).where(AllocationRow.job_id == a))
            assert a_alloc is not None and a_alloc.ended_at is None and a_alloc.cluster_id == a_cluster
            c_row = s.get(ClusterRow, c_cluster)
            # c's cluster was not kept idle for the pool while b waited: taken by b, or let go.
            assert c_row is not None and (c_row.state in ("TERMINATING", "TERMINATED")
                                          or _cluster_of(engine, b) == c_cluster)
        run_until(engine, lambda: job_row(engine, a).state in ("SUCCEEDED", "FAILED"))
        assert job_row(engine, a).state == "SUCCEEDED"
        assert "done: 600 steps" in (broker.settings.home / "logs" / a / "attempt-1-node-0.log").read_text()
    finally:
        broker.close()


@pytest.mark.slow
def test_a_job_holding_a_reservation_counts_as_queued_so_the_pool_lets_an_idle_cluster_go(tmp_path: Path) -> None:
    broker = _broker(tmp_path, max_gpus=12, pool_idle_s=900.0)
    engine = broker.start()
    try:
        # a is on time (about 450 market s, says 10 minutes); c says half an hour and is done in a minute.
        a = _submit(engine, tmp_path, "a", TRAIN.format(steps=300), work="10m")
        c = _submit(engine, tmp_path, "c", TRAIN.format(steps=40), work="30m", nodes=2)
        run_until(engine, lambda: job_row(engine, a).state == job_row(engine, c).state == "RUNNING")
        b = _submit(engine, tmp_path, "b", TRAIN.format(steps=40))  # the pool is full: it reserves a's GPUs
        run_until(engine, lambda: bool(_events(engine, b, "eager_reserve")))
        assert _events(engine, b, "eager_reserve")[0].detail["after_job"] == a
        c_cluster = _cluster_of(engine, c)

        def c_gone() -> bool:
            with engine.store.transaction() as s:
                row = s.get(ClusterRow, c_cluster)
                return row is not None and row.state in ("TERMINATING", "TERMINATED")
        run_until(engine, c_gone, timeout=60)
        with engine.store.transaction() as s:
            row = s.get(ClusterRow, c_cluster)
            assert row is not None and row.teardown_reason == "idle"
            assert row.terminate_at is not None and row.up_at is not None
            assert (row.terminate_at - row.up_at).total_seconds() < 900  # well before the pool's idle time
        # a is on time: b keeps its reservation and waits for a's GPUs.
        assert job_row(engine, b).state == "PROVISIONING" and not _events(engine, b, "eager_give_up")
        assert job_row(engine, a).state == "RUNNING"
    finally:
        broker.close()
