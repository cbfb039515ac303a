"""A job's checkpoints and attempts: which checkpoint it resumes from (a notice's or an agent's report,
whichever was written last), when its grace is over, and what work an attempt cut short lost."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from broker.clock import AcceleratedClock
from broker.engine import checkpoint_reports, checkpoints
from broker.engine.checkpoint_reports import ReportedCheckpoint
from broker.spec.job import parse_job_spec
from broker.store import Store, open_store
from broker.store.tables import JobRow, NoticeRow
from tests.broker.engine.store_rows import T0, add, get, new_allocation, new_cluster, new_job, stopped_clock

# A replay at sixty times the wall's pace whose tick 0 is T0: wall T0 + 10 s is market T0 + 10 min.
FAST = AcceleratedClock(T0.timestamp(), 60.0)
# A market clock that is the wall's: an agent's wall stamp reads back as itself.
WALL = AcceleratedClock(T0.timestamp(), 1.0)


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    opened = open_store(f"sqlite:///{tmp_path / 'store.db'}")
    yield opened
    opened.dispose()


def _notice(checkpoint: str | None = None, received: datetime = T0, cluster_id: str = "c1", key: str = "n",
            **detail: Any) -> NoticeRow:
    return NoticeRow(dedup_key=key, cluster_id=cluster_id, node="0", kind="terminate", source="agent",
                     received_at=received, checkpoint=checkpoint, detail=detail)


def _iso(at: datetime) -> str:
    return at.isoformat()


# ----------------------------------------------------------------------------- current_allocation


def test_the_current_allocation_is_the_latest_attempts_ended_or_not(db_url: str) -> None:
    store = open_store(db_url)
    try:
        add(store, new_job("j1"), new_cluster("c1"), new_cluster("c2"),
            new_allocation("j1", "c1", 1, ended_at=T0 + timedelta(minutes=9), outcome="preempted"),
            new_allocation("j1", "c2", 2, started=T0 + timedelta(minutes=10), ended_at=T0 + timedelta(minutes=20),
                           outcome="failed"))
        with store.transaction() as s:
            job = get(s, JobRow, "j1")
            assert checkpoints.current_allocation(s, job) is None  # before its first start
            job.attempt = 1
            first = checkpoints.current_allocation(s, job)
            assert first is not None and first.cluster_id == "c1"
            job.attempt = 2
            second = checkpoints.current_allocation(s, job)
            assert second is not None and second.cluster_id == "c2" and second.ended_at is not None
            job.attempt = 3  # counted up, not yet placed
            assert checkpoints.current_allocation(s, job) is None
    finally:
        store.dispose()


# ----------------------------------------------------------------------------- reported_since, grace_over


def test_reported_since_counts_reports_written_at_or_after_the_request(store: Store) -> None:
    add(store, new_job("j1"), new_cluster("c1"), new_allocation("j1", "c1"))
    requested = T0 + timedelta(minutes=10)
    with store.transaction() as s:
        assert not checkpoints.reported_since(s, get(s, JobRow, "j1"), requested)
    checkpoint_reports.record(store, ReportedCheckpoint("j1", "c1", "0", "old", requested - timedelta(seconds=1)), T0)
    with store.transaction() as s:
        assert not checkpoints.reported_since(s, get(s, JobRow, "j1"), requested)
    checkpoint_reports.record(store, ReportedCheckpoint("j1", "c1", "0", "new", requested), T0)
    with store.transaction() as s:
        assert checkpoints.reported_since(s, get(s, JobRow, "j1"), requested)


@pytest.mark.parametrize(("broker", "grace"), [("", 120.0), ("broker:\n  checkpoint:\n    grace: 30s\n", 30.0)])
def test_the_grace_is_over_once_the_specs_grace_has_passed(broker: str, grace: float) -> None:
    spec = parse_job_spec(f"run: x\n{broker}", offline=True)
    clock = stopped_clock()
    now = clock.now()
    assert checkpoints.grace_over(clock, spec, now - timedelta(seconds=grace))
    assert checkpoints.grace_over(clock, spec, now - timedelta(seconds=grace + 600))
    assert not checkpoints.grace_over(clock, spec, now - timedelta(seconds=grace) + timedelta(milliseconds=1))
    assert not checkpoints.grace_over(clock, spec, now)


# ----------------------------------------------------------------------------- noticed_at


def test_noticed_at_is_when_the_agent_saw_the_notice_on_the_market_clock() -> None:
    seen = T0 + timedelta(seconds=10)  # a wall time the agent stamped
    notice = _notice(received=T0 + timedelta(hours=1), noticed_at=_iso(seen))
    assert checkpoints.noticed_at(FAST, notice) == T0 + timedelta(minutes=10)


@pytest.mark.parametrize("detail", [{}, {"noticed_at": None}, {"noticed_at": ""}, {"noticed_at": "yesterday"},
                                    {"noticed_at": 12345}, {"noticed_at": ["2026-01-01"]}])
def test_without_a_readable_sighting_the_notice_counts_from_when_it_was_received(detail: dict[str, Any]) -> None:
    received = T0 + timedelta(hours=1)
    notice = _notice(received=received, **detail)
    assert checkpoints.noticed_at(FAST, notice) == received
    notice.detail = None  # type: ignore[assignment]  # an old row written before detail had a default
    assert checkpoints.noticed_at(FAST, notice) == received


# ----------------------------------------------------------------------------- record_checkpoint


def test_a_notices_checkpoint_is_taken_when_it_is_newer() -> None:
    job = new_job("j1", checkpoint="/ckpt/j1/a", checkpoint_at=T0 + timedelta(minutes=10))
    checkpoints.record_checkpoint(WALL, job, _notice("/ckpt/j1/older", checkpoint_at=_iso(T0)))
    assert (job.checkpoint, job.checkpoint_at) == ("/ckpt/j1/a", T0 + timedelta(minutes=10))
    # The agent stamps its wall time; the job keeps it on the market clock (at 60x, 20 s are 20 minutes).
    checkpoints.record_checkpoint(FAST, job, _notice("/ckpt/j1/b", checkpoint_at=_iso(T0 + timedelta(seconds=20))))
    assert (job.checkpoint, job.checkpoint_at) == ("/ckpt/j1/b", T0 + timedelta(minutes=20))
    checkpoints.record_checkpoint(FAST, job, _notice("/ckpt/j1/c", checkpoint_at=_iso(T0 + timedelta(seconds=20))))
    assert job.checkpoint == "/ckpt/j1/c"  # written at the same moment: the later notice's wins


def test_a_notice_without_a_checkpoint_or_with_the_same_one_changes_nothing() -> None:
    job = new_job("j1", checkpoint="/ckpt/j1/a", checkpoint_at=T0)
    clock = stopped_clock(T0 + timedelta(hours=1))
    checkpoints.record_checkpoint(clock, job, _notice(None, checkpoint_at=_iso(T0 + timedelta(minutes=5))))
    checkpoints.record_checkpoint(clock, job, _notice("", checkpoint_at=_iso(T0 + timedelta(minutes=5))))
    checkpoints.record_checkpoint(clock, job, _notice("/ckpt/j1/a", checkpoint_at=_iso(T0 + timedelta(minutes=5))))
    assert (job.checkpoint, job.checkpoint_at) == ("/ckpt/j1/a", T0)


def test_a_checkpoint_without_a_time_counts_as_written_now() -> None:
    job = new_job("j1")
    later = T0 + timedelta(hours=2)
    checkpoints.record_checkpoint(stopped_clock(later), job, _notice("/ckpt/j1/first"))
    assert job.checkpoint == "/ckpt/j1/first"
    assert job.checkpoint_at is not None and abs((job.checkpoint_at - later).total_seconds()) < 0.01


# ----------------------------------------------------------------------------- refresh_checkpoint


def test_refresh_takes_whichever_of_notice_and_report_was_written_last(db_url: str) -> None:
    store = open_store(db_url)
    clock = WALL
    try:
        add(store, new_job("j1"), new_cluster("c1"), new_cluster("c2"), new_allocation("j1", "c1"),
            _notice("/ckpt/j1/from-notice", key="c1:n", checkpoint_at=_iso(T0 + timedelta(minutes=10))),
            _notice("/ckpt/j1/other-cluster", cluster_id="c2", key="c2:n",
                    checkpoint_at=_iso(T0 + timedelta(minutes=50))))
        with store.transaction() as s:
            job = get(s, JobRow, "j1")
            checkpoints.refresh_checkpoint(s, clock, job, "c1")
            assert (job.checkpoint, job.checkpoint_at) == ("/ckpt/j1/from-notice", T0 + timedelta(minutes=10))
        checkpoint_reports.record(store, ReportedCheckpoint("j1", "c1", "0", "older", T0 + timedelta(minutes=5)), T0)
        with store.transaction() as s:
            job = get(s, JobRow, "j1")
            checkpoints.refresh_checkpoint(s, clock, job, "c1")
            assert job.checkpoint == "/ckpt/j1/from-notice"  # the report is older: kept
        checkpoint_reports.record(store, ReportedCheckpoint("j1", "c1", "1", "step-9/m.pt",
                                                            T0 + timedelta(minutes=30)), T0)
        with store.transaction() as s:
            job = get(s, JobRow, "j1")
            checkpoints.refresh_checkpoint(s, clock, job, "c1")
            assert (job.checkpoint, job.checkpoint_at) == ("/ckpt/j1/step-9/m.pt", T0 + timedelta(minutes=30))
        with store.transaction() as s:
            job = get(s, JobRow, "j1")
            assert job.checkpoint == "/ckpt/j1/step-9/m.pt"  # written back by the transaction
    finally:
        store.dispose()


def test_refresh_with_nothing_reported_leaves_the_job_as_it_was(store: Store) -> None:
    add(store, new_job("j1"), new_cluster("c1"))
    with store.transaction() as s:
        job = get(s, JobRow, "j1")
        checkpoints.refresh_checkpoint(s, stopped_clock(), job, "c1")
        assert (job.checkpoint, job.checkpoint_at) == (None, None)


# ----------------------------------------------------------------------------- end_allocation, close_attempt


def test_an_allocation_is_ended_once_with_its_first_outcome() -> None:
    alloc = new_allocation("j1", "c1")
    checkpoints.end_allocation(alloc, "succeeded", T0 + timedelta(minutes=5))
    checkpoints.end_allocation(alloc, "preempted", T0 + timedelta(minutes=9))
    assert (alloc.ended_at, alloc.outcome) == (T0 + timedelta(minutes=5), "succeeded")


@pytest.mark.parametrize(("running_at", "checkpoint_at", "lost_s"), [
    (T0 + timedelta(minutes=2), T0 + timedelta(minutes=7), 3 * 60.0),  # lost since the checkpoint
    (T0 + timedelta(minutes=2), T0 + timedelta(minutes=1), 8 * 60.0),  # older checkpoint: lost since it ran
    (None, None, 10 * 60.0),  # never reported running, no checkpoint: lost since it started
    (T0 + timedelta(minutes=2), T0 + timedelta(minutes=10), 0.0),  # checkpointed as it stopped
    (T0 + timedelta(minutes=2), T0 + timedelta(minutes=12), 0.0),  # a checkpoint stamped later: never negative
])
def test_an_attempt_cut_short_loses_the_work_since_its_last_checkpoint(running_at: datetime | None,
                                                                        checkpoint_at: datetime | None,
                                                                        lost_s: float) -> None:
    job = new_job("j1", checkpoint_at=checkpoint_at, work_lost_s=100.0)
    alloc = new_allocation("j1", "c1", running_at=running_at)
    stopped = T0 + timedelta(minutes=10)
    checkpoints.close_attempt(job, alloc, stopped)
    assert (alloc.ended_at, alloc.outcome) == (stopped, "preempted")
    assert job.work_lost_s == pytest.approx(100.0 + lost_s)


# ----------------------------------------------------------------------------- progress_s


def test_progress_is_every_attempts_running_time_less_the_work_lost(db_url: str) -> None:
    store = open_store(db_url)
    now = T0 + timedelta(hours=1)
    try:
        add(store, new_job("j1", work_lost_s=120.0), new_job("j2"), new_cluster("c1"),
            # 10 minutes from running to its end (the 2 minutes of setup before it ran do not count) ...
            new_allocation("j1", "c1", 1, running_at=T0 + timedelta(minutes=2), ended_at=T0 + timedelta(minutes=12)),
            # ... 5 from its start (never reported running) ...
            new_allocation("j1", "c1", 2, started=T0 + timedelta(minutes=20), ended_at=T0 + timedelta(minutes=25)),
            # ... and 20 so far on the attempt still running.
            new_allocation("j1", "c1", 3, started=T0 + timedelta(minutes=39), running_at=T0 + timedelta(minutes=40)),
            new_allocation("j2", "c1", 1, running_at=T0))
        with store.transaction() as s:
            assert checkpoints.progress_s(s, get(s, JobRow, "j1"), now) == pytest.approx(35 * 60.0 - 120.0)
            get(s, JobRow, "j1").work_lost_s = 10 * 3600.0
            assert checkpoints.progress_s(s, get(s, JobRow, "j1"), now) == 0.0  # never below nothing
            assert checkpoints.progress_s(s, get(s, JobRow, "j2"), now) == pytest.approx(3600.0)
            assert checkpoints.progress_s(s, get(s, JobRow, "j2"), T0 - timedelta(minutes=5)) == 0.0
    finally:
        store.dispose()


def test_a_job_never_started_has_made_no_progress(store: Store) -> None:
    add(store, new_job("j1"))
    with store.transaction() as s:
        assert checkpoints.progress_s(s, get(s, JobRow, "j1"), T0 + timedelta(days=1)) == 0.0
