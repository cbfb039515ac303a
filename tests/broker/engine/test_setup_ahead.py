"""A reserved job's setup run ahead on the local backend, with real training processes and real setups."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from sqlalchemy import select

from broker.backends.local.host import process_alive
from broker.config.settings import load_settings
from broker.engine import Engine, machine
from broker.runtime import Runtime, assemble
from broker.spec.job import parse_job_spec
from broker.store.tables import AllocationRow, EarlySetupRow, JobEventRow
from tests.broker.engine.one_zone import job_row, one_zone_market, run_until

EXAMPLES = Path(__file__).resolve().parents[3] / "examples"

JOB = """\
name: {name}
resources:
  accelerators: V100:4
workdir: {workdir}
{setup}run: {run}
broker:
  work: 1m
"""
TRAIN = "python train.py --steps {steps} --step-seconds 0.05 --checkpoint-every 50"
# Each setup run appends the wall time it ended at, so a test counts the runs and sees when they ended.
NOTE = "python -c 'import time; print(time.time())' >> {notes}"


def _broker(tmp_path: Path) -> Runtime:
    path = one_zone_market(tmp_path / "m.csv", 4)
    settings = load_settings(market=path, speed=30.0, local_provision_seconds=60.0, max_gpus=4,
                             eager_policy="eager", eager_lead_seconds=3600.0)
    return assemble(settings, fresh_market=True)


def _submit(engine: Engine, tmp_path: Path, name: str, run: str, setup: str | None = None) -> str:
    block = f"setup: {json.dumps(setup)}\n" if setup else ""
    text = JOB.format(name=name, workdir=EXAMPLES, run=run, setup=block)
    return engine.submit(parse_job_spec(text, source=str(tmp_path / f"{name}.yaml")))


def _events(engine: Engine, job_id: str, kind: str) -> list[JobEventRow]:
    with engine.store.transaction() as s:
        rows = list(s.scalars(select(JobEventRow).where(JobEventRow.job_id == job_id, JobEventRow.kind == kind)))
        for row in rows:
            s.expunge(row)
        return rows


def _allocation(engine: Engine, job_id: str) -> AllocationRow:
    with engine.store.transaction() as s:
        row = s.scalar(select(AllocationRow).where(AllocationRow.job_id == job_id))
        assert row is not None
        s.expunge(row)
        return row


def _finished(engine: Engine, *ids: str) -> bool:
    return all(job_row(engine, i).state in ("SUCCEEDED", "FAILED", "CANCELLED") for i in ids)


@pytest.mark.slow
def test_the_next_jobs_setup_runs_before_the_gpus_free_up_and_its_start_runs_only_run(tmp_path: Path) -> None:
    notes = tmp_path / "setups.txt"
    broker = _broker(tmp_path)
    engine = broker.start()
    try:
        a = _submit(engine, tmp_path, "a", TRAIN.format(steps=200))
        run_until(engine, lambda: job_row(engine, a).state == "RUNNING")
        b = _submit(engine, tmp_path, "b", TRAIN.format(steps=20), setup=NOTE.format(notes=notes))
        run_until(engine, lambda: _finished(engine, a, b))
        assert job_row(engine, a).state == job_row(engine, b).state == "SUCCEEDED"
        ended = [float(line) for line in notes.read_text().split()]
        assert len(ended) == 1  # the early setup, and no second one at the start
        a_left = broker.world.clock.to_wall(_allocation(engine, a).ended_at)  # type: ignore[arg-type]
        assert ended[0] < a_left  # it had ended while a still held the GPUs
        assert _allocation(engine, b).started_at >= _allocation(engine, a).ended_at  # type: ignore[operator]
        assert [e.detail["attempt"] for e in _events(engine, b, "early_setup_done")] == [1]
        with engine.store.transaction() as s:
            rows = list(s.scalars(select(EarlySetupRow)))
        assert [(r.job_id, r.outcome) for r in rows] == [(b, "used")]
        assert rows[0].started_at < _allocation(engine, a).ended_at  # type: ignore[operator]
    finally:
        broker.close()


@pytest.mark.slow
def test_a_failed_early_setup_falls_back_to_the_setup_at_the_start(tmp_path: Path) -> None:
    notes, tried = tmp_path / "setups.txt", tmp_path / "tried"
    # Fails the first time it runs (the early one), succeeds the second (at the start).
    setup = f"{NOTE.format(notes=notes)}; test -e {tried} || {{ touch {tried}; exit 7; }}"
    broker = _broker(tmp_path)
    engine = broker.start()
    try:
        a = _submit(engine, tmp_path, "a", TRAIN.format(steps=200))
        run_until(engine, lambda: job_row(engine, a).state == "RUNNING")
        b = _submit(engine, tmp_path, "b", TRAIN.format(steps=20), setup=setup)
        run_until(engine, lambda: _finished(engine, a, b))
        assert job_row(engine, b).state == "SUCCEEDED"
        failed = _events(engine, b, "early_setup_failed")
        assert len(failed) == 1 and failed[0].detail["reason"] == "node-0: setup exited with code 7"
        assert not _events(engine, b, "early_setup_done")
        ended = [float(line) for line in notes.read_text().split()]
        a_left = broker.world.clock.to_wall(_allocation(engine, a).ended_at)  # type: ignore[arg-type]
        assert len(ended) == 2 and ended[0] < a_left <= ended[1]  # early, then again at its start
    finally:
        broker.close()


@pytest.mark.slow
def test_a_cancelled_next_jobs_early_setup_is_stopped(tmp_path: Path) -> None:
    pid_file = tmp_path / "setup.pid"
    broker = _broker(tmp_path)
    engine = broker.start()
    try:
        a = _submit(engine, tmp_path, "a", TRAIN.format(steps=200))
        run_until(engine, lambda: job_row(engine, a).state == "RUNNING")
        b = _submit(engine, tmp_path, "b", TRAIN.format(steps=20), setup=f"echo $$ > {pid_file}; sleep 300")
        run_until(engine, lambda: pid_file.exists() and pid_file.read_text().strip() != "")
        pid = int(pid_file.read_text())
        assert process_alive(pid) and job_row(engine, a).state == "RUNNING"
        machine.cancel_job(engine.store, b, engine.clock)
        run_until(engine, lambda: bool(_events(engine, b, "early_setup_stopped")))
        run_until(engine, lambda: not process_alive(pid), timeout=10)
        assert "CANCELLED" in str(_events(engine, b, "early_setup_stopped")[0].detail["reason"])
        assert job_row(engine, a).state == "RUNNING"  # the job beside it runs on
        with engine.store.transaction() as s:
            assert [r.outcome for r in s.scalars(select(EarlySetupRow))] == ["stopped"]
        run_until(engine, lambda: _finished(engine, a))
        assert job_row(engine, a).state == "SUCCEEDED"
    finally:
        broker.close()
