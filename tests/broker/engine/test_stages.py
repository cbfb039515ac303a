"""Pipelines: a chained stage waits while the stage before it is active, is released (its relative
deadline counted from then) when that stage succeeded, and is cancelled, naming why, when it ended
any other way; the rest of the chain follows."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from sqlalchemy import select

from broker.engine import machine, stages
from broker.engine.parts import Parts
from broker.model import JobState
from broker.spec.job import Pipeline, parse_job_file
from broker.store import Store, open_store
from broker.store.tables import JobEventRow, JobRow
from tests.broker.engine.store_rows import T0, get, make_parts, set_job, stopped_clock, submitted

CHAIN = """\
name: etl
---
name: prep
run: python prep.py
---
name: train
resources:
  accelerators: V100:4
broker:
  deadline: 3h
run: python train.py
---
name: serve
broker:
  deadline: 2030-06-01T00:00:00Z
run: python serve.py
"""
RELEASED_AT = T0 + timedelta(hours=5)


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    opened = open_store(f"sqlite:///{tmp_path / 'store.db'}")
    yield opened
    opened.dispose()


def _chain(store: Store, home: Path) -> list[str]:
    pipeline = parse_job_file(CHAIN, source="etl.yaml", offline=True)
    assert isinstance(pipeline, Pipeline)
    return machine.submit_pipeline(store, stopped_clock(T0), pipeline, home, "local")


def _held_back(store: Store, parts: Parts, job_id: str) -> bool:
    with store.transaction() as s:
        return stages.held_back(parts, s, get(s, JobRow, job_id))


def _job(store: Store, job_id: str) -> JobRow:
    with store.transaction() as s:
        job = get(s, JobRow, job_id)
        s.expunge(job)
        return job


def _events(store: Store, job_id: str) -> list[JobEventRow]:
    with store.transaction() as s:
        rows = list(s.scalars(select(JobEventRow).where(JobEventRow.job_id == job_id).order_by(JobEventRow.id)))
        s.expunge_all()
        return rows


def test_a_job_outside_a_chain_is_never_held_back(store: Store, broker_home: Path) -> None:
    parts = make_parts(store, broker_home, stopped_clock(RELEASED_AT))
    job_id = submitted(store, broker_home)
    assert not _held_back(store, parts, job_id)
    assert [e.kind for e in _events(store, job_id)] == ["submitted"]


def test_the_first_stage_is_free_and_the_others_wait_on_the_one_before(store: Store, broker_home: Path) -> None:
    prep, train, serve = _chain(store, broker_home)
    assert [(_job(store, j).stage, _job(store, j).after_job_id) for j in (prep, train, serve)] == [
        (1, None), (2, prep), (3, train)]
    parts = make_parts(store, broker_home, stopped_clock(RELEASED_AT))
    assert not _held_back(store, parts, prep)
    for state in (JobState.PENDING, JobState.PROVISIONING, JobState.RUNNING, JobState.CHECKPOINTING,
                  JobState.MIGRATING):
        set_job(store, prep, state=state.value)
        assert _held_back(store, parts, train), state
        assert (_job(store, train).state, _job(store, train).after_job_id) == ("PENDING", prep)
    assert _held_back(store, parts, serve)  # its own stage before has not even started
    assert [e.kind for e in _events(store, train)] == ["submitted"]


def test_a_stage_is_released_when_the_one_before_succeeded_and_its_deadline_counts_from_then(
        store: Store, broker_home: Path) -> None:
    prep, train, serve = _chain(store, broker_home)
    assert _job(store, train).deadline == T0 + timedelta(hours=3)  # as submitted
    parts = make_parts(store, broker_home, stopped_clock(RELEASED_AT))
    now = parts.clock.now()
    set_job(store, prep, state=JobState.SUCCEEDED.value)
    assert not _held_back(store, parts, train)
    released = _job(store, train)
    assert (released.state, released.after_job_id, released.deadline) == ("PENDING", None, now + timedelta(hours=3))
    last = _events(store, train)[-1]
    assert (last.kind, last.to_state, last.detail, last.at) == ("released", "PENDING", {"after": prep, "stage": 2},
                                                                now)
    assert not _held_back(store, parts, train)  # released once: an ordinary queued job from now on
    assert [e.kind for e in _events(store, train)] == ["submitted", "released"]
    set_job(store, train, state=JobState.SUCCEEDED.value)
    assert not _held_back(store, parts, serve)
    assert _job(store, serve).deadline == datetime(2030, 6, 1, tzinfo=UTC)  # an absolute deadline stands


@pytest.mark.parametrize("ended", [JobState.FAILED, JobState.CANCELLED])
def test_when_a_stage_ends_unsuccessfully_the_rest_of_the_chain_is_cancelled(store: Store, broker_home: Path,
                                                                             ended: JobState) -> None:
    prep, train, serve = _chain(store, broker_home)
    parts = make_parts(store, broker_home, stopped_clock(RELEASED_AT))
    set_job(store, prep, state=ended.value)
    assert _held_back(store, parts, train)
    why = f"stage 1 (prep) ended {ended.value}: the pipeline stops there"
    stopped = _job(store, train)
    assert (stopped.state, stopped.reason, stopped.finished_at) == ("CANCELLED", why, parts.clock.now())
    last = _events(store, train)[-1]
    assert (last.from_state, last.to_state, last.detail) == ("PENDING", "CANCELLED", {"reason": why})
    assert _held_back(store, parts, serve)
    assert (_job(store, serve).state, _job(store, serve).reason) == (
        "CANCELLED", "stage 2 (train) ended CANCELLED: the pipeline stops there")


def test_a_stage_whose_stage_before_is_gone_is_cancelled_naming_it(store: Store, broker_home: Path) -> None:
    job_id = submitted(store, broker_home)
    set_job(store, job_id, after_job_id="j-vanished", stage=4)
    parts = make_parts(store, broker_home, stopped_clock(RELEASED_AT))
    assert _held_back(store, parts, job_id)
    assert (_job(store, job_id).state, _job(store, job_id).reason) == (
        "CANCELLED", "stage 3 (j-vanished) ended CANCELLED: the pipeline stops there")
