"""A page of summaries read in bulk (``PageSource``) is, field for field, each job's own summary
(``SessionSource``), on both stores: pool clusters, several attempts, tied report times, earlier
finished jobs of the same name (and another team's, which do not count), jobs with no rows at all."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from sqlalchemy import event, select

from broker.status import page_source
from broker.status.orm_source import job_summary
from broker.status.page_source import page_summaries
from broker.store import open_store
from broker.store.gpu import GpuRollupRow
from broker.store.tables import AllocationRow, ClusterRow, JobRow, LedgerRow, PredictionRow, ProgressRow

T0 = datetime(2026, 3, 1, tzinfo=UTC)
NOW = T0 + timedelta(days=2)


def _job(job_id: str, name: str, state: str, minutes: int, team: str = "alpha", **extra: Any) -> JobRow:
    created = T0 + timedelta(minutes=minutes)
    ended = state in ("SUCCEEDED", "FAILED", "CANCELLED")
    return JobRow(id=job_id, name=name, team=team, state=state, priority=500, spec={"name": name}, backend="local",
                  num_nodes=1, gpus_per_node=1, checkpoint_dir="/c", created_at=created, updated_at=created,
                  zones=["z1"], work_s=3600.0, wall_started_at=created,
                  finished_at=created + timedelta(hours=1) if ended else None,
                  wall_finished_at=created + timedelta(hours=1) if ended else None, **extra)


def _cluster(cluster_id: str, job_id: str | None, minutes: int, up: bool = True) -> ClusterRow:
    at = T0 + timedelta(minutes=minutes)
    return ClusterRow(id=cluster_id, launch_key=cluster_id, job_id=job_id, backend="local", cloud="aws",
                      region="r", zone=f"z-{cluster_id}", instance_type="p3.2xlarge", gpus_per_node=4, num_nodes=1,
                      spot=True, price_per_node_hour=1.0 + minutes / 100, on_demand_price_per_node_hour=3.0,
                      state="UP", handle={}, created_at=at, up_at=at if up else None)


def _fill(s: Any) -> None:
    s.add_all([
        _job("j-pend", "lonely", "PENDING", 0),
        _job("j-run", "sweep", "RUNNING", 1, attempt=2),
        *[_job(f"j-done{i}", "sweep", "SUCCEEDED", 2 + i) for i in range(24)],  # more than the 20 scored
        _job("j-theirs", "sweep", "SUCCEEDED", 3, team="beta"),
        _job("j-other", "other", "SUCCEEDED", 4),
        _job("j-failed", "other", "FAILED", 5),
    ])
    s.flush()
    s.add_all([_cluster("c-own", "j-run", 1), _cluster("c-pool", "j-other", 2), _cluster("c-new", "j-failed", 9),
               _cluster("c-old", "j-failed", 6), _cluster("c-down", "j-failed", 12, up=False)])
    s.flush()
    s.add_all([
        AllocationRow(job_id="j-run", cluster_id="c-own", attempt=1, gpus={"0": [0]}, started_at=T0,
                      running_at=T0 + timedelta(minutes=2), ended_at=T0 + timedelta(minutes=30)),
        AllocationRow(job_id="j-run", cluster_id="c-pool", attempt=2, gpus={"0": [1]},
                      started_at=T0 + timedelta(minutes=31)),
        AllocationRow(job_id="j-other", cluster_id="c-pool", attempt=1, gpus={"0": [0]}, started_at=T0,
                      running_at=T0, ended_at=T0 + timedelta(hours=1)),
    ])
    tied = T0 + timedelta(minutes=40)
    s.add_all([ProgressRow(job_id="j-run", attempt=2, step=step, total=100, at=tied) for step in (7, 5)])
    s.add(ProgressRow(job_id="j-run", attempt=1, step=50, total=100, at=T0 + timedelta(minutes=20)))
    for i in range(24):
        done = f"j-done{i}"
        for k in range(3):
            s.add(PredictionRow(job_id=done, attempt=1, made_at=T0 + timedelta(minutes=2 + i + 10 * k),
                                finish_at=T0 + timedelta(minutes=50 + i * 3 + k), low_at=T0, high_at=NOW,
                                source="progress"))
    s.add_all([PredictionRow(job_id="j-run", attempt=2, made_at=tied, finish_at=tied + timedelta(hours=h),
                             low_at=tied, high_at=NOW, source="work") for h in (1, 2)])
    s.add(PredictionRow(job_id="j-theirs", attempt=1, made_at=T0, finish_at=NOW, low_at=T0, high_at=NOW,
                        source="work"))
    for minute in range(3):
        s.add(LedgerRow(cluster_id="c-pool", minute=T0 + timedelta(minutes=minute), holder="job:j-run",
                        job_id="j-run", team="alpha", usage="job", cloud="aws", region="r", zone="z", instance_type="i",
                        nodes=1, gpus=1.0, spot=True, price_per_node_hour=1.0, on_demand_price_per_node_hour=3.0,
                        cost=0.25 * (minute + 1), on_demand_cost=0.75))
    s.add_all([GpuRollupRow(job_id="j-run", node=f"n{n}", hour=T0, gpu_minutes=60, measured_seconds=3600.0,
                            utilization_seconds=3600.0 * 40 * (n + 1), peak_memory_mb=1000.0 * (n + 1))
               for n in range(2)])


def test_a_page_read_in_bulk_is_each_jobs_own_summary(db_url: str) -> None:
    store = open_store(db_url)
    try:
        with store.transaction() as s:
            _fill(s)
        with store.transaction() as s:
            jobs = list(s.scalars(select(JobRow).where(JobRow.team == "alpha").order_by(JobRow.id)))
            one_by_one = [job_summary(s, job, NOW) for job in jobs]
        with store.transaction() as s:
            jobs = list(s.scalars(select(JobRow).where(JobRow.team == "alpha").order_by(JobRow.id)))
            statements: list[str] = []
            event.listen(s.connection(), "before_cursor_execute", lambda *a: statements.append(a[2]))
            bulk = page_summaries(s, jobs, NOW)
        assert bulk == one_by_one
        # The fields the rows above make interesting are not all empty (the comparison compares something).
        running = next(summary for summary in bulk if summary["job_id"] == "j-run")
        assert running["zone"] == "z-c-pool" and running["cost"] == 1.5 and running["progress"]["step"] in (5, 7)
        assert running["gpu"] is not None and running["predicted_finish"] is not None
        assert next(x for x in bulk if x["job_id"] == "j-failed")["zone"] == "z-c-new"
        assert bulk[0]["earlier_prediction_error"]["jobs"] == 20
        assert len(statements) <= 10, statements  # one per kind of row, not per job (28 jobs here)
    finally:
        store.dispose()


def test_an_empty_page_reads_nothing(db_url: str) -> None:
    store = open_store(db_url)
    try:
        with store.transaction() as s:
            assert page_summaries(s, []) == []
    finally:
        store.dispose()


def test_kept_errors_give_the_same_page_and_follow_a_newly_finished_job(db_url: str) -> None:
    """A second page is answered from the prediction errors kept across requests (no prediction read), is
    still each job's own summary, and a job of the name that succeeds afterwards is scored at once."""
    store = open_store(db_url)
    try:
        with store.transaction() as s:
            _fill(s)
        with store.transaction() as s:
            page_summaries(s, list(s.scalars(select(JobRow).where(JobRow.team == "alpha"))), NOW)
        with store.transaction() as s:
            s.add(_job("j-late", "sweep", "SUCCEEDED", 60))
            s.add(PredictionRow(job_id="j-late", attempt=1, made_at=T0, finish_at=T0 + timedelta(hours=9),
                                low_at=T0, high_at=NOW, source="work"))
        with store.transaction() as s:
            jobs = list(s.scalars(select(JobRow).where(JobRow.team == "alpha").order_by(JobRow.id)))
            one_by_one = [job_summary(s, job, NOW) for job in jobs]
        with store.transaction() as s:
            jobs = list(s.scalars(select(JobRow).where(JobRow.team == "alpha").order_by(JobRow.id)))
            read: list[tuple[str, str]] = []
            event.listen(s.connection(), "before_cursor_execute", lambda *a: read.append((a[2], str(a[3]))))
            bulk = page_summaries(s, jobs, NOW)
        assert bulk == one_by_one
        # Only the new job's predictions are read for their errors; the others' were kept.
        scoring = [params for statement, params in read if "ORDER BY predictions.id" in statement]
        assert len(scoring) == 1 and "j-late" in scoring[0] and "j-done" not in scoring[0]
        late = next(x for x in bulk if x["job_id"] == "j-late")
        assert late["prediction_error_s"] is not None
        assert next(x for x in bulk if x["job_id"] == "j-pend")["earlier_prediction_error"] is None
        running = next(x for x in bulk if x["job_id"] == "j-run")
        assert running["earlier_prediction_error"] == one_by_one[jobs.index(next(j for j in jobs if j.id == "j-run"))][
            "earlier_prediction_error"]
    finally:
        store.dispose()


def test_a_page_of_more_names_than_one_statement_reads(db_url: str) -> None:
    """300 names on one page: read in more than one statement (SQLite takes at most 500 branches), the
    same summaries."""
    store = open_store(db_url)
    try:
        with store.transaction() as s:
            s.add_all([_job(f"j-n{i:03d}-{k}", f"name-{i}", "SUCCEEDED", i + k) for i in range(300) for k in range(2)])
            s.flush()
            s.add_all([PredictionRow(job_id=f"j-n{i:03d}-{k}", attempt=1, made_at=T0,
                                     finish_at=T0 + timedelta(minutes=30 + i), low_at=T0, high_at=NOW,
                                     source="work") for i in range(300) for k in range(2)])
        with store.transaction() as s:
            jobs = list(s.scalars(select(JobRow).order_by(JobRow.id)))
            one_by_one = [job_summary(s, job, NOW) for job in jobs]
        with store.transaction() as s:
            jobs = list(s.scalars(select(JobRow).order_by(JobRow.id)))
            bulk = page_summaries(s, jobs, NOW)
        assert bulk == one_by_one
        assert all(x["earlier_prediction_error"]["jobs"] == 1 for x in bulk)
    finally:
        store.dispose()


def test_a_full_keep_starts_again_and_the_pages_stay_the_same(db_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """More finished jobs than a process keeps: the keep starts again mid-read, and every page is still
    each job's own summary."""
    monkeypatch.setattr(page_source, "KEPT_JOBS", 5)
    store = open_store(db_url)
    try:
        with store.transaction() as s:
            _fill(s)
        for _ in range(3):
            with store.transaction() as s:
                jobs = list(s.scalars(select(JobRow).where(JobRow.team == "alpha").order_by(JobRow.id)))
                one_by_one = [job_summary(s, job, NOW) for job in jobs]
            with store.transaction() as s:
                jobs = list(s.scalars(select(JobRow).where(JobRow.team == "alpha").order_by(JobRow.id)))
                assert page_summaries(s, jobs, NOW) == one_by_one
        assert len(page_source._kept_of(store.engine).jobs()) <= 5
    finally:
        store.dispose()
