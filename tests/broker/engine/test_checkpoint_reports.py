"""The checkpoints agents report: paths kept inside the job's directory, each recorded once, only from a
cluster that ran the job, and the newest one found by when it was written."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest
from sqlalchemy import func, select

from broker.engine import checkpoint_reports
from broker.engine.checkpoint_reports import MAX_PATH_CHARS, CheckpointRefused, ReportedCheckpoint
from broker.store import Store, open_store
from broker.store.tables import CheckpointReportRow, JobRow
from tests.broker.engine.store_rows import T0, add, get, new_allocation, new_cluster, new_job

RECEIVED = T0 + timedelta(minutes=30)


def _opened(url: str) -> Store:
    opened = open_store(url)
    add(opened, new_job("j1"), new_job("j2"), new_cluster("c1", job_id="j1"), new_cluster("c2", job_id="j2"),
        new_allocation("j1", "c1", ended_at=T0 + timedelta(minutes=5), outcome="preempted"),
        new_allocation("j2", "c2"))
    return opened


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    opened = _opened(f"sqlite:///{tmp_path / 'store.db'}")
    yield opened
    opened.dispose()


@pytest.fixture
def db_store(db_url: str) -> Iterator[Store]:
    """On SQLite and PostgreSQL: the unique (job, path) a duplicate runs into, and the newest's ordering."""
    opened = _opened(db_url)
    yield opened
    opened.dispose()


def _report(path: str, minutes: float = 0.0, job_id: str = "j1", cluster_id: str = "c1",
            step: int | None = None) -> ReportedCheckpoint:
    return ReportedCheckpoint(job_id, cluster_id, "0", path, T0 + timedelta(minutes=minutes), step)


def _stored(store: Store) -> list[tuple[str, str, str, int | None]]:
    with store.transaction() as s:
        return [(r.job_id, r.cluster_id, r.path, r.step)
                for r in s.scalars(select(CheckpointReportRow).order_by(CheckpointReportRow.id))]


@pytest.mark.parametrize(("given", "kept"), [
    ("step-10/model.pt", "step-10/model.pt"),
    ("./a//b/", "a/b"),
    ("a/b/../c", "a/c"),
    ("..hidden", "..hidden"),  # a name that begins with two dots is still inside
    ("a/..b/c", "a/..b/c"),
    ("é/模型 1.pt", "é/模型 1.pt"),
    ("x" * MAX_PATH_CHARS, "x" * MAX_PATH_CHARS),
])
def test_a_path_inside_the_checkpoint_directory_is_kept_normalised(given: str, kept: str) -> None:
    assert checkpoint_reports.clean_relative_path(given) == kept


@pytest.mark.parametrize(("given", "why"), [
    ("", "expected 1-1024 characters"),
    ("x" * (MAX_PATH_CHARS + 1), "expected 1-1024 characters"),
    ("x" * 10_000_000, "expected 1-1024 characters"),
    ("a\x00b", "NUL bytes and backslashes"),
    ("a\\b", "NUL bytes and backslashes"),
    ("/etc/passwd", "relative to the job's checkpoint directory"),
    ("s3://other-bucket/ckpt", "relative to the job's checkpoint directory"),
    (".", "must lie inside"),
    ("./", "must lie inside"),
    ("a/..", "must lie inside"),
    ("..", "must lie inside"),
    ("../other-job/ckpt", "must lie inside"),
    ("a/../../other-job", "must lie inside"),
])
def test_a_path_that_is_empty_huge_hostile_or_outside_is_refused_naming_the_field(given: str, why: str) -> None:
    with pytest.raises(CheckpointRefused) as refused:
        checkpoint_reports.clean_relative_path(given)
    message = str(refused.value)
    assert message.startswith("path: ") and why in message and "\n" not in message
    assert len(message) < 120  # the input is never echoed back


def test_a_path_with_a_lone_surrogate_is_refused_naming_the_field() -> None:
    with pytest.raises(CheckpointRefused, match=r"^path: "):
        checkpoint_reports.clean_relative_path("ckpt-\ud800")


@pytest.mark.parametrize(("directory", "relative", "named"), [
    ("/ckpt/j1", "step-3/model.pt", "/ckpt/j1/step-3/model.pt"),
    ("/ckpt/j1/", "m.pt", "/ckpt/j1/m.pt"),
    ("s3://bucket/jobs/j1///", "m.pt", "s3://bucket/jobs/j1/m.pt"),
    ("gs://bucket", "a/b", "gs://bucket/a/b"),
])
def test_resolve_names_the_checkpoint_inside_the_jobs_directory(directory: str, relative: str, named: str) -> None:
    assert checkpoint_reports.resolve(directory, relative) == named


def test_a_report_is_recorded_once_per_job_and_path(db_store: Store) -> None:
    first, duplicate = checkpoint_reports.record(db_store, _report("step-1/m.pt", step=1), RECEIVED)
    assert not duplicate
    # The same checkpoint reported again (another node, a retry), spelled another way: the first record.
    assert checkpoint_reports.record(db_store, _report("./step-1//m.pt", 2, step=9), RECEIVED) == (first, True)
    second, duplicate = checkpoint_reports.record(db_store, _report("step-2/m.pt", 3, step=2), RECEIVED)
    assert second != first and not duplicate
    other, duplicate = checkpoint_reports.record(db_store, _report("step-1/m.pt", job_id="j2", cluster_id="c2"),
                                                 RECEIVED)
    assert other not in (first, second) and not duplicate  # the same path of another job is its own
    assert _stored(db_store) == [("j1", "c1", "step-1/m.pt", 1), ("j1", "c1", "step-2/m.pt", 2),
                              ("j2", "c2", "step-1/m.pt", None)]
    with db_store.transaction() as s:
        row = get(s, CheckpointReportRow, first)
        assert (row.written_at, row.received_at, row.node) == (T0, RECEIVED, "0")


@pytest.mark.parametrize(("job_id", "cluster_id"), [("j1", "c2"), ("j2", "c1"), ("nothere", "c1")])
def test_a_cluster_cannot_report_for_a_job_it_never_ran(store: Store, job_id: str, cluster_id: str) -> None:
    with pytest.raises(CheckpointRefused, match=r"^job_id: this cluster never ran that job$"):
        checkpoint_reports.record(store, _report("m.pt", job_id=job_id, cluster_id=cluster_id), RECEIVED)
    assert _stored(store) == []


def test_a_refused_path_stores_nothing(store: Store) -> None:
    with pytest.raises(CheckpointRefused, match=r"^path: "):
        checkpoint_reports.record(store, _report("../j2/m.pt"), RECEIVED)
    with store.transaction() as s:
        assert s.scalar(select(func.count()).select_from(CheckpointReportRow)) == 0


def test_newest_is_the_latest_written_and_since_bounds_it(db_store: Store) -> None:
    with db_store.transaction() as s:
        assert checkpoint_reports.newest(s, get(s, JobRow, "j1")) is None
    # Reported out of order: the newest is the one written last, not the one received last.
    for path, minutes in (("b", 20), ("a", 10), ("c", 15)):
        checkpoint_reports.record(db_store, _report(path, minutes), RECEIVED)
    checkpoint_reports.record(db_store, _report("later", 99, job_id="j2", cluster_id="c2"), RECEIVED)
    with db_store.transaction() as s:
        job = get(s, JobRow, "j1")
        newest = checkpoint_reports.newest(s, job)
        assert newest is not None and newest.path == "b"
        at_since = checkpoint_reports.newest(s, job, since=T0 + timedelta(minutes=20))  # inclusive
        assert at_since is not None and at_since.path == "b"
        assert checkpoint_reports.newest(s, job, since=T0 + timedelta(minutes=20, microseconds=1)) is None


def test_of_two_written_at_the_same_moment_the_later_report_is_newest(db_store: Store) -> None:
    checkpoint_reports.record(db_store, _report("first", 10), RECEIVED)
    checkpoint_reports.record(db_store, _report("second", 10), RECEIVED)
    with db_store.transaction() as s:
        newest = checkpoint_reports.newest(s, get(s, JobRow, "j1"))
        assert newest is not None and newest.path == "second"
