"""A job a GPU limit holds back gets one ``queue_full``/``fleet_full`` event per spell of waiting, not one
per engine step: again only once it was held back by the other limit (or launched, or moved) in between."""

from __future__ import annotations

from pathlib import Path

import pytest
from sqlalchemy import select

from broker.config.settings import load_settings
from broker.engine import Engine, machine
from broker.runtime import assemble
from broker.spec.job import parse_job_spec
from broker.store.tables import JobEventRow, JobRow
from tests.broker.engine.one_zone import one_zone_market, run_until

EXAMPLES = Path(__file__).resolve().parents[3] / "examples"
JOB = """\
name: {name}
resources:
  accelerators: V100:4
workdir: {workdir}
run: python train.py --steps 4000 --step-seconds 0.05
broker:
  priority: {priority}
"""


def _submit(engine: Engine, tmp_path: Path, name: str, priority: str) -> str:
    text = JOB.format(name=name, workdir=EXAMPLES, priority=priority)
    return engine.submit(parse_job_spec(text, source=str(tmp_path / f"{name}.yaml")))


def _blocks(engine: Engine, job_id: str) -> list[str]:
    with engine.store.transaction() as s:
        return list(s.scalars(select(JobEventRow.kind).where(
            JobEventRow.job_id == job_id, JobEventRow.kind.in_(("queue_full", "fleet_full"))).order_by(JobEventRow.id)))


def _state(engine: Engine, job_id: str) -> str:
    with engine.store.transaction() as s:
        return s.get(JobRow, job_id).state  # type: ignore[union-attr]


def _steps(engine: Engine, count: int) -> None:
    for _ in range(count):
        engine.step()


@pytest.mark.slow
def test_a_waiting_job_gets_one_event_per_reason_it_waits_for(tmp_path: Path) -> None:
    path = one_zone_market(tmp_path / "m.csv", 4)
    settings = load_settings(market=path, speed=30.0, local_provision_seconds=60.0, max_gpus=8,
                             queue_max_gpus={"training": 4}, pool_idle_seconds=0.0)
    broker = assemble(settings, fresh_market=True)
    engine = broker.start()
    try:
        first = _submit(engine, tmp_path, "first", "training")
        run_until(engine, lambda: _state(engine, first) == "RUNNING")
        waiting = _submit(engine, tmp_path, "waiting", "training")  # the training queue holds its 4 GPUs
        _steps(engine, 60)
        assert _state(engine, waiting) == "PENDING"
        assert _blocks(engine, waiting) == ["queue_full"]  # once, not once per step

        other = _submit(engine, tmp_path, "other", "inference")  # another queue fills the pool's 8 GPUs
        run_until(engine, lambda: _state(engine, other) == "RUNNING")
        _steps(engine, 60)
        assert _blocks(engine, waiting) == ["queue_full", "fleet_full"]

        machine.cancel_job(engine.store, other, engine.clock)  # room in the pool again: the queue's limit holds
        run_until(engine, lambda: len(_blocks(engine, waiting)) > 2)
        _steps(engine, 60)
        assert _blocks(engine, waiting) == ["queue_full", "fleet_full", "queue_full"]
        assert _state(engine, waiting) == "PENDING"
    finally:
        for job_id in engine.active_jobs():
            machine.cancel_job(engine.store, job_id, engine.clock)
        _steps(engine, 3)
        broker.close()
