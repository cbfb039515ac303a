"""Predicted finish times: what the engine keeps for a running job, and what `status` shows of them."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from rich.console import Console
from sqlalchemy import func, select

from broker.cli.job_output import status_table
from broker.engine import forecast
from broker.status.orm_source import job_summary
from broker.store import Store, open_store
from broker.store.tables import AllocationRow, ClusterRow, JobRow, PredictionRow, ProgressRow

T0 = datetime(2026, 1, 1, 12, tzinfo=UTC)


def _setup(store: Store, job_id: str, started: datetime) -> None:
    with store.transaction() as s:
        if s.get(ClusterRow, "c1") is None:
            s.add(ClusterRow(id="c1", launch_key="k1", backend="local", cloud="aws", region="us-east-1",
                             zone="us-east-1a", instance_type="p3.8xlarge", accelerator="V100", gpus_per_node=4,
                             num_nodes=1, spot=True, price_per_node_hour=3.67, on_demand_price_per_node_hour=12.24,
                             state="UP", created_at=T0, up_at=T0, handle={}))
        s.add(JobRow(id=job_id, name="train", team="ml", state="RUNNING", spec={}, checkpoint_dir="/tmp/x",
                     num_nodes=1, gpus_per_node=4, zones=[], attempt=1, created_at=started, updated_at=started,
                     started_at=started))
        s.flush()
        s.add(AllocationRow(job_id=job_id, cluster_id="c1", attempt=1, gpus={"0": [0, 1, 2, 3]},
                            started_at=started, running_at=started + timedelta(seconds=5)))


def _report(store: Store, job_id: str, at: datetime, step: int, total: int = 400) -> None:
    with store.transaction() as s:
        s.add(ProgressRow(job_id=job_id, attempt=1, step=step, total=total, at=at))


def _summary(store: Store, job_id: str) -> dict[str, object]:
    with store.transaction() as s:
        job = s.get(JobRow, job_id)
        assert job is not None
        return job_summary(s, job)


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    store = open_store(f"sqlite:///{tmp_path / 'store.db'}")
    yield store
    store.dispose()


def test_status_shows_progress_the_predicted_finish_and_how_far_off_earlier_predictions_were(
        store: Store) -> None:
    _setup(store, "a", T0)
    # A slow first report (start-up), then 10 steps every 20 s: 2 s a step.
    _report(store, "a", T0 + timedelta(seconds=60), 10)
    for i in range(1, 8):
        _report(store, "a", T0 + timedelta(seconds=60 + 20 * i), 10 + 10 * i)
    now = T0 + timedelta(seconds=200)  # last report (step 80) at 200 s: 320 steps left
    forecast.record(store, now)
    forecast.record(store, now + timedelta(seconds=5))  # too soon: not kept twice
    with store.transaction() as s:
        rows = list(s.scalars(select(PredictionRow)))
    assert len(rows) == 1 and rows[0].source == "progress"
    assert rows[0].finish_at == now + timedelta(seconds=640)
    summary = _summary(store, "a")
    assert summary["progress"] == {"step": 80, "total": 400}
    assert summary["started_at"] == (T0 + timedelta(seconds=5)).isoformat()
    assert summary["predicted_finish"] == (now + timedelta(seconds=640)).isoformat()
    assert summary["predicted_finish_low"] == summary["predicted_finish_high"] == summary["predicted_finish"]
    assert summary["earlier_prediction_error"] is None

    # a finishes 40 s later than predicted; b, of the same name and team, is told so.
    finished = now + timedelta(seconds=680)
    with store.transaction() as s:
        job = s.get(JobRow, "a")
        assert job is not None
        job.state, job.finished_at = "SUCCEEDED", finished
    assert _summary(store, "a")["prediction_error_s"] == 40.0
    _setup(store, "b", finished)
    earlier = _summary(store, "b")["earlier_prediction_error"]
    assert earlier == {"jobs": 1, "median_error_s": 40.0, "median_error_pct": pytest.approx(5.9, abs=0.05)}

    console = Console(width=250, record=True)
    console.print(status_table([_summary(store, "a"), _summary(store, "b")]))
    text = console.export_text()
    assert "100% (finished)" in text and "predictions off by 40 s" in text  # a succeeded (last report: 80/400)
    assert "off by 40 s (6%), 1 job(s)" in text


def test_no_progress_and_no_history_means_no_prediction(store: Store) -> None:
    _setup(store, "a", T0)
    forecast.record(store, T0 + timedelta(minutes=5))
    summary = _summary(store, "a")
    assert summary["progress"] is None and summary["predicted_finish"] is None


def test_a_stated_work_estimate_predicts_before_any_progress(store: Store) -> None:
    _setup(store, "a", T0)
    with store.transaction() as s:
        s.get(JobRow, "a").work_s = 600.0  # type: ignore[union-attr]
    now = T0 + timedelta(seconds=105)  # ran 100 s since its run began at 5 s
    forecast.record(store, now)
    summary = _summary(store, "a")
    assert summary["prediction_source"] == "work"
    assert summary["predicted_finish"] == (now + timedelta(seconds=500)).isoformat()
    assert summary["predicted_finish_low"] == (now + timedelta(seconds=400)).isoformat()


def test_predictions_of_many_jobs_at_once_ask_what_each_job_alone_asks(store: Store) -> None:
    """``Reads`` sums a name and team's history once for all its jobs: each job's request is still the one
    read for it alone, whether it is among the first ``MAX_HISTORY`` earlier jobs or past them."""
    count = forecast.MAX_HISTORY + 6
    for i in range(count):
        _setup(store, f"j{i:03d}", T0 + timedelta(seconds=i))
    with store.transaction() as s:
        for i, job in enumerate(s.scalars(select(JobRow).order_by(JobRow.id))):
            if i % 3 == 0:  # some of them finished: a history with both kinds
                job.state = "SUCCEEDED"
                alloc = s.scalar(select(AllocationRow).where(AllocationRow.job_id == job.id))
                assert alloc is not None
                alloc.ended_at = T0 + timedelta(minutes=10 + i)
    now = T0 + timedelta(hours=1)
    with store.transaction() as s:
        jobs = list(s.scalars(select(JobRow).where(JobRow.state == "RUNNING").order_by(JobRow.id)))
        reads = forecast.Reads(s, jobs, now)
        picked = [jobs[0], jobs[1], jobs[len(jobs) // 2], jobs[-2], jobs[-1]]  # newest first in history
        for job in picked:
            assert forecast.prediction_request(s, job, now, reads) == forecast.prediction_request(s, job, now)


def test_a_job_nothing_predicts_is_tried_again_only_after_the_interval(store: Store) -> None:
    _setup(store, "a", T0)
    unknown: dict[str, tuple[int, datetime]] = {}
    forecast.record(store, T0 + timedelta(minutes=5), unknown)
    assert unknown == {"a": (1, T0 + timedelta(minutes=5))}
    with store.transaction() as s:
        s.get(JobRow, "a").work_s = 600.0  # type: ignore[union-attr]
    forecast.record(store, T0 + timedelta(minutes=5, seconds=10), unknown)  # within the interval: not tried
    assert _summary(store, "a")["predicted_finish"] is None
    forecast.record(store, T0 + timedelta(minutes=5) + forecast.RECORD_EVERY, unknown)
    assert _summary(store, "a")["prediction_source"] == "work"


def test_a_bounded_record_predicts_the_stalest_first_and_the_rest_on_the_next_calls(store: Store) -> None:
    for job_id in ("a", "b", "c"):
        _setup(store, job_id, T0)
    with store.transaction() as s:
        for job in s.scalars(select(JobRow)):
            job.work_s = 600.0
    now = T0 + timedelta(minutes=5)
    assert forecast.record(store, now, {}, limit=2) == 2
    assert forecast.record(store, now, {}, limit=2) == 1  # the one left: none is predicted twice
    assert forecast.record(store, now, {}, limit=2) == 0
    later = now + forecast.RECORD_EVERY + timedelta(seconds=1)
    with store.transaction() as s:  # c's prediction is the newest: a and b are due first
        s.add(PredictionRow(job_id="c", attempt=1, made_at=now + timedelta(seconds=2), source="work",
                            finish_at=later, low_at=later, high_at=later))
    assert forecast.record(store, later, {}, limit=2) == 2
    with store.transaction() as s:
        made = {job_id: at for job_id, at in s.execute(select(PredictionRow.job_id, func.max(PredictionRow.made_at))
                                                       .group_by(PredictionRow.job_id))}
    assert made["a"] == made["b"] == later.replace(tzinfo=made["a"].tzinfo)
    assert made["c"] != made["a"]
