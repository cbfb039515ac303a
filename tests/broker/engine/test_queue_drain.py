"""Queue drain: a cluster's GPUs between one job's end and the next one's start, in the ledger and the report."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from sqlalchemy import select

from broker.engine.metering import meter_cluster
from broker.reports.build import Window, build_report
from broker.store import open_store
from broker.store.tables import AllocationRow, ClusterRow, JobRow, LedgerRow
from providers.local import LocalMarket
from providers.trace import read_trace
from tests.broker.engine.one_zone import one_zone_market

T0 = datetime(2026, 1, 1, 12, tzinfo=UTC)


def _job(job_id: str, state: str, **extra: object) -> JobRow:
    return JobRow(id=job_id, name="train", team="ml", state=state, spec={}, checkpoint_dir="/tmp/x", num_nodes=1,
                  gpus_per_node=4, zones=[], created_at=T0, updated_at=T0, **extra)


def _meter(store: object, market: LocalMarket, until: datetime) -> None:
    with store.transaction() as s:  # type: ignore[attr-defined]
        row = s.get(ClusterRow, "c1")
        meter_cluster(s, row, until, market)


def test_minutes_between_two_jobs_with_one_queued_are_queue_drain_and_the_report_says_so(
        tmp_path: Path, db_url: str) -> None:
    path = tmp_path / "market.csv"
    one_zone_market(path, 2, 30, T0)
    market = LocalMarket(read_trace(path), T0)
    store = open_store(db_url)
    try:
        with store.transaction() as s:
            s.add(ClusterRow(id="c1", launch_key="k1", job_id=None, backend="local", cloud="aws", region="us-east-1",
                             zone="us-east-1a", instance_type="p3.8xlarge", accelerator="V100", gpus_per_node=4,
                             num_nodes=1, spot=True, price_per_node_hour=3.67, on_demand_price_per_node_hour=12.24,
                             state="UP", created_at=T0, up_at=T0, handle={}))
            s.add(_job("a", "SUCCEEDED", finished_at=T0 + timedelta(minutes=3)))
            s.add(_job("b", "PENDING"))
            s.flush()
            s.add(AllocationRow(job_id="a", cluster_id="c1", attempt=1, gpus={"0": [0, 1, 2, 3]}, started_at=T0,
                                running_at=T0, ended_at=T0 + timedelta(minutes=3), outcome="succeeded"))
        _meter(store, market, T0 + timedelta(minutes=5))  # a ended, b still queued: two minutes of drain
        with store.transaction() as s:
            b = s.get(JobRow, "b")
            assert b is not None
            b.state, b.target_cluster_id, b.target_gpus = "PROVISIONING", "c1", {"0": [0, 1, 2, 3]}
        _meter(store, market, T0 + timedelta(minutes=6))  # b heading there, not started: still drain
        with store.transaction() as s:
            s.get(JobRow, "b").state = "RUNNING"  # type: ignore[union-attr]
            s.add(AllocationRow(job_id="b", cluster_id="c1", attempt=1, gpus={"0": [0, 1, 2, 3]},
                                started_at=T0 + timedelta(minutes=6), running_at=T0 + timedelta(minutes=6)))
        _meter(store, market, T0 + timedelta(minutes=8))
        with store.transaction() as s:
            ledger = list(s.scalars(select(LedgerRow).order_by(LedgerRow.minute)))
        usage = [(int((r.minute - T0).total_seconds() // 60), r.usage) for r in ledger]
        assert usage == [(0, "running"), (1, "running"), (2, "running"), (3, "queue_drain"), (4, "queue_drain"),
                         (5, "queue_drain"), (6, "running"), (7, "running")]
        drain_hours = sum(r.gpus * r.seconds for r in ledger if r.usage == "queue_drain") / 3600
        assert drain_hours == pytest.approx(4 * 3 / 60)
        report = build_report(store, Window(T0, T0 + timedelta(minutes=8)))
        assert report.totals.idle_gpu_hours["queue_drain"] == pytest.approx(drain_hours)
        assert report.totals.idle_cost["queue_drain"] == pytest.approx(
            sum(r.cost for r in ledger if r.usage == "queue_drain"))
        assert any(w.cause == "queue_drain" for w in report.wastes)
    finally:
        store.dispose()


def test_a_job_ending_with_nothing_queued_leaves_finished_minutes_not_queue_drain(tmp_path: Path) -> None:
    path = tmp_path / "market.csv"
    one_zone_market(path, 2, 30, T0)
    market = LocalMarket(read_trace(path), T0)
    store = open_store(f"sqlite:///{tmp_path / 'store.db'}")
    try:
        with store.transaction() as s:
            s.add(ClusterRow(id="c1", launch_key="k1", backend="local", cloud="aws", region="us-east-1",
                             zone="us-east-1a", instance_type="p3.8xlarge", accelerator="V100", gpus_per_node=4,
                             num_nodes=1, spot=True, price_per_node_hour=3.67, on_demand_price_per_node_hour=12.24,
                             state="UP", created_at=T0, up_at=T0, handle={}))
            s.add(_job("a", "SUCCEEDED", finished_at=T0 + timedelta(minutes=1)))
            s.flush()
            s.add(AllocationRow(job_id="a", cluster_id="c1", attempt=1, gpus={"0": [0, 1, 2, 3]}, started_at=T0,
                                running_at=T0, ended_at=T0 + timedelta(minutes=1), outcome="succeeded"))
        _meter(store, market, T0 + timedelta(minutes=3))
        with store.transaction() as s:
            assert [r.usage for r in s.scalars(select(LedgerRow).order_by(LedgerRow.minute))] == [
                "running", "finished", "finished"]
    finally:
        store.dispose()
