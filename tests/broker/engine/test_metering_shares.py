"""The ledger of a shared GPU: each job pays its share, what the shares leave is stranded, nothing is lost.

One node of 2 A100s for 4 minutes. Minutes 0-1: job h (0.5) and job q (0.25) share GPU 0, GPU 1 is
free. Minutes 2-3: h alone. By hand, per minute: h 0.5, q 0.25, stranded 0.25, free 1.0, then h 0.5,
stranded 0.5, free 1.0; every minute sums to the node's 2 GPUs, and the money splits the same way.
"""

from __future__ import annotations

from collections import defaultdict
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from sqlalchemy import select

from broker.engine.metering import meter_cluster
from broker.reports.build import Window, build_report
from broker.reports.render import summary_lines
from broker.store import open_store
from broker.store.tables import AllocationRow, ClusterRow, JobRow, LedgerRow
from providers.base import SpotQuote
from providers.local import LocalMarket
from providers.trace import read_trace, write_trace

T0 = datetime(2026, 1, 1, 12, tzinfo=UTC)
PRICE = 2.4  # USD per node-hour: 0.02 a node-minute


def _job(job_id: str, share: float) -> JobRow:
    return JobRow(id=job_id, name=job_id, team="ml", state="SUCCEEDED", priority=500, spec={"run": "x"},
                  backend="local", num_nodes=1, gpus_per_node=1, checkpoint_dir="ckpt", created_at=T0,
                  updated_at=T0, zones=[], gpu_share=share)


def test_a_shared_gpu_splits_its_minutes_by_share_and_strands_the_rest(tmp_path: Path, db_url: str) -> None:
    path = tmp_path / "market.csv"
    write_trace(path, [SpotQuote("gcp", "us-central1", "us-central1-a", "a2-highgpu-2g", "A100", 2, PRICE, 7.35,
                                 T0 + timedelta(minutes=m), available_nodes=1) for m in range(10)])
    market = LocalMarket(read_trace(path), T0)
    store = open_store(db_url)
    try:
        with store.transaction() as s:
            s.add(ClusterRow(id="c1", launch_key="k1", backend="local", cloud="gcp", region="us-central1",
                             zone="us-central1-a", instance_type="a2-highgpu-2g", accelerator="A100",
                             gpus_per_node=2, num_nodes=1, spot=True, price_per_node_hour=PRICE,
                             on_demand_price_per_node_hour=7.35, state="TERMINATED", created_at=T0, up_at=T0,
                             terminated_at=T0 + timedelta(minutes=4), handle={}))
            s.add_all([_job("h", 0.5), _job("q", 0.25)])
            s.flush()
            s.add_all([
                AllocationRow(job_id="h", cluster_id="c1", attempt=1, gpus={"0": [0]}, gpu_share=0.5,
                              started_at=T0, running_at=T0, ended_at=T0 + timedelta(minutes=4), outcome="succeeded"),
                AllocationRow(job_id="q", cluster_id="c1", attempt=1, gpus={"0": [0]}, gpu_share=0.25,
                              started_at=T0, running_at=T0, ended_at=T0 + timedelta(minutes=2), outcome="succeeded"),
            ])
        with store.transaction() as s:
            row = s.get(ClusterRow, "c1")
            assert row is not None
            meter_cluster(s, row, T0 + timedelta(minutes=5), market)
        with store.transaction() as s:
            ledger = list(s.scalars(select(LedgerRow)))
        per_minute: dict[int, dict[str, float]] = defaultdict(dict)
        for r in ledger:
            per_minute[int((r.minute - T0).total_seconds() // 60)][r.holder] = r.gpus
        shared = {"job:h": 0.5, "job:q": 0.25, "idle:stranded": 0.25, "idle:waiting": 1.0}
        alone = {"job:h": 0.5, "idle:stranded": 0.5, "idle:waiting": 1.0}
        assert dict(per_minute) == {0: shared, 1: shared, 2: alone, 3: alone}
        # The money: every minute costs the node's price, split by GPUs held.
        assert sum(r.cost for r in ledger) == pytest.approx(4 * PRICE / 60)
        assert sum(r.cost for r in ledger if r.holder == "job:q") == pytest.approx(2 * PRICE / 60 * 0.25 / 2)

        report = build_report(store, Window(T0, T0 + timedelta(minutes=4)))
        t = report.totals
        assert t.gpu_hours == pytest.approx(8 / 60)
        assert t.shared_gpu_hours == pytest.approx((4 * 0.5 + 2 * 0.25) / 60)
        assert t.stranded_gpu_hours == pytest.approx((2 * 0.25 + 2 * 0.5) / 60)
        assert summary_lines(report)[-1] == ("GPU sharing: 0.0 GPU-h held as fractions of GPUs, 0.0 GPU-h stranded "
                                             "beside them (38% of the shared GPUs' time)")
        assert any(w.cause == "stranded" and "sat unused beside their fractions" in w.suggestion for w in report.wastes)
    finally:
        store.dispose()
