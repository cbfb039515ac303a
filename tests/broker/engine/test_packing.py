"""Several gangs on one cluster: packing by topology, queueing, and checkpoint-aware preemption."""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from sqlalchemy import select

from broker.config.settings import load_settings
from broker.engine import Engine, packing
from broker.reports.build import Window, build_report
from broker.runtime import assemble
from broker.spec.job import parse_job_spec
from broker.store import open_store
from broker.store.tables import AllocationRow, ClusterRow, JobEventRow, JobRow, LedgerRow
from providers.topology import NVLINK, topology
from tests.broker.engine.one_zone import one_zone_market, run_until

EXAMPLES = Path(__file__).resolve().parents[3] / "examples"

JOB = """\
name: {name}
resources:
  accelerators: V100:{gpus}
workdir: {workdir}
run: python train.py --steps {steps} --step-seconds 0.05 --checkpoint-every 25
broker:
  priority: {priority}
"""


def _submit(engine: Engine, tmp_path: Path, name: str, gpus: int, steps: int, priority: str) -> str:
    text = JOB.format(name=name, gpus=gpus, workdir=EXAMPLES, steps=steps, priority=priority)
    return engine.submit(parse_job_spec(text, source=str(tmp_path / f"{name}.yaml")))


def _states(engine: Engine, *job_ids: str) -> list[str]:
    with engine.store.transaction() as s:
        return [s.get(JobRow, j).state for j in job_ids]  # type: ignore[union-attr]


def _step_until(engine: Engine, done: Callable[[], bool], timeout: float = 180) -> list[datetime]:
    """Steps until ``done``, returning the clock at the end of each step: "at once" is then a number of
    steps, which a loaded machine does not stretch as it stretches market seconds."""
    ends: list[datetime] = []
    deadline = time.time() + timeout
    while time.time() < deadline:
        engine.step()
        ends.append(engine.clock.now())
        if done():
            return ends
        time.sleep(0.05)
    raise AssertionError("timed out")


def _within_a_step_of(when: datetime, later: datetime, step_ends: list[datetime]) -> bool:
    """``later`` happened no later than the end of the step after the one during which ``when`` did."""
    during = next(i for i, end in enumerate(step_ends) if end >= when)
    return when <= later <= step_ends[min(during + 1, len(step_ends) - 1)]



@pytest.mark.slow
def test_gangs_share_a_cluster_and_a_higher_priority_gang_preempts(tmp_path: Path, broker_home: Path) -> None:
    settings = load_settings(market=one_zone_market(tmp_path / "m.csv", 1), speed=30.0, local_provision_seconds=60.0,
                             max_gpus=4)
    broker = assemble(settings, fresh_market=True)
    engine = broker.start()
    try:
        a = _submit(engine, tmp_path, "a", 2, 240, "batch")
        run_until(engine, lambda: _states(engine, a) == ["RUNNING"])
        b = _submit(engine, tmp_path, "b", 2, 240, "batch")
        run_until(engine, lambda: _states(engine, a, b) == ["RUNNING", "RUNNING"])
        time.sleep(2.0)  # let both make progress past a checkpoint
        c = _submit(engine, tmp_path, "c", 4, 40, "inference")
        step_ends = _step_until(engine, lambda: all(st in ("SUCCEEDED", "FAILED") for st in _states(engine, a, b, c)))
        for _ in range(5):
            engine.step()
            time.sleep(0.1)
        with engine.store.transaction() as s:
            jobs = {j.id: j for j in s.scalars(select(JobRow))}
            clusters = list(s.scalars(select(ClusterRow)))
            allocations = list(s.scalars(select(AllocationRow).order_by(AllocationRow.started_at)))
            events = list(s.scalars(select(JobEventRow).where(JobEventRow.job_id == c)))
            ledger = list(s.scalars(select(LedgerRow)))
    finally:
        broker.close()

    assert [jobs[j].state for j in (a, b, c)] == ["SUCCEEDED"] * 3
    assert len(clusters) == 1  # everything ran on the one cluster the first job launched

    first_a, first_b = (next(x for x in allocations if x.job_id == j) for j in (a, b))
    gpus_a, gpus_b = set(first_a.gpus["0"]), set(first_b.gpus["0"])
    assert not gpus_a & gpus_b and len(gpus_a) == len(gpus_b) == 2
    p3 = topology("p3.8xlarge")
    assert all(p3.link_kind[x][y] == NVLINK for x, y in (sorted(gpus_a), sorted(gpus_b)))

    # c took the GPUs of both batch gangs; they checkpointed, were requeued and resumed there.
    assert any(e.to_state == "PROVISIONING" and sorted(e.detail.get("preempting", [])) == sorted([a, b])
               for e in events)
    for victim in (a, b):
        assert jobs[victim].preemptions == 1 and jobs[victim].attempt == 2
        log = (broker_home / "logs" / victim / "attempt-2-node-0.log").read_text()
        assert "resumed from step-" in log and "done: 240 steps" in log
    run_c = next(x for x in allocations if x.job_id == c)
    yielded = max(x.ended_at for x in allocations if x.job_id in (a, b) and x.attempt == 1)
    assert _within_a_step_of(yielded, run_c.started_at, step_ends)
    # When c ended, the queued gangs started on its GPUs at once, without a new cluster.
    resumed = min(x.started_at for x in allocations if x.job_id in (a, b) and x.attempt == 2)
    assert _within_a_step_of(run_c.ended_at, resumed, step_ends)

    # Every minute of the cluster accounts for its 4 GPUs exactly once across holders.
    per_minute: dict[datetime, float] = defaultdict(float)
    for row in ledger:
        per_minute[row.minute] += row.gpus
    assert per_minute and all(total == pytest.approx(4.0) for total in per_minute.values())
    assert {r.holder for r in ledger} >= {f"job:{a}", f"job:{b}", f"job:{c}"}

    # The cost report built from this ledger: its totals are the ledger's, and the idle breakdown is
    # exactly the GPU-hours allocated but not spent running.
    store = open_store(settings.database_url)
    report = build_report(store, Window(min(r.minute for r in ledger), max(r.minute for r in ledger)
                                        + timedelta(minutes=1)))
    store.dispose()
    gpu_hours = sum(r.gpus * r.seconds for r in ledger) / 3600
    running = sum(r.gpus * r.seconds for r in ledger if r.usage == "running") / 3600
    assert report.totals.spend == pytest.approx(sum(r.cost for r in ledger))
    assert report.totals.on_demand == pytest.approx(sum(r.on_demand_cost for r in ledger))
    assert report.totals.gpu_hours == pytest.approx(gpu_hours)
    assert report.totals.idle_total_gpu_hours == pytest.approx(gpu_hours - running)
    assert report.totals.preemptions == 2
    assert report.totals.work_lost_s == pytest.approx(sum(jobs[j].work_lost_s for j in (a, b, c)))


def test_snapshot_counts_gpus_a_preemptor_claims_from_a_gang_still_leaving(db_url: str) -> None:
    store = open_store(db_url)
    now = datetime.now(UTC)
    with store.transaction() as s:
        for job_id, state in (("victim", "CHECKPOINTING"), ("preemptor", "PROVISIONING")):
            s.add(JobRow(id=job_id, name=job_id, team="a", state=state, priority=500, spec={}, backend="local",
                         num_nodes=1, gpus_per_node=4, checkpoint_dir="/c", created_at=now, updated_at=now,
                         zones=[]))
        s.flush()
        s.add(ClusterRow(id="c1", launch_key="c1", job_id="victim", backend="local", cloud="aws", region="r",
                         zone="z", instance_type="p3.8xlarge", accelerator="V100", gpus_per_node=4, num_nodes=1,
                         spot=True, price_per_node_hour=1.0, on_demand_price_per_node_hour=3.0, state="UP",
                         token_hash="x", handle={}, created_at=now))
        s.flush()
        s.add(AllocationRow(job_id="victim", cluster_id="c1", attempt=1, gpus={"0": [0, 1]}, started_at=now,
                            running_at=now, stopping_at=now))
        preemptor = s.get(JobRow, "preemptor")
        assert preemptor is not None
        preemptor.target_cluster_id, preemptor.target_gpus = "c1", {"0": [0, 1, 2]}
    with store.transaction() as s:
        row = s.get(ClusterRow, "c1")
        assert row is not None
        snap = packing.snapshot(s, row)
    assert snap.holders[0] == ("victim", "victim", "preemptor", None)
