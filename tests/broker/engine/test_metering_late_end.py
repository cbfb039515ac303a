"""Metering a cluster whose end the broker learns late: no minute is billed past its end.

A cloud (or a restarted engine) can report a cluster ended at a moment before minutes the broker
already metered while it believed the cluster alive; those minutes were never the cluster's.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

from sqlalchemy import select

from broker.engine.metering import meter_cluster
from broker.store import open_store
from broker.store.tables import ClusterRow, LedgerRow
from providers.base import SpotQuote
from providers.local import LocalMarket
from providers.trace import read_trace, write_trace
from tests.ledger_checks import ledger_outside_cluster_life

T0 = datetime(2026, 1, 1, 12, tzinfo=UTC)


def test_an_end_learned_late_takes_back_the_minutes_billed_after_it(tmp_path: Path, db_url: str) -> None:
    path = tmp_path / "market.csv"
    write_trace(path, [SpotQuote("aws", "us-east-1", "us-east-1a", "p3.2xlarge", "V100", 1, 0.9, 3.06,
                                 T0 + timedelta(minutes=m), available_nodes=2) for m in range(30)])
    market = LocalMarket(read_trace(path), T0)
    store = open_store(db_url)
    try:
        created = T0 + timedelta(seconds=30)
        with store.transaction() as s:
            s.add(ClusterRow(id="c1", launch_key="k1", backend="local", cloud="aws", region="us-east-1",
                             zone="us-east-1a", instance_type="p3.2xlarge", accelerator="V100", gpus_per_node=1,
                             num_nodes=1, spot=True, price_per_node_hour=0.9, on_demand_price_per_node_hour=3.06,
                             state="UP", created_at=created, up_at=created, handle={}))
        with store.transaction() as s:
            row = s.get(ClusterRow, "c1")
            assert row is not None
            meter_cluster(s, row, T0 + timedelta(minutes=5, seconds=10), market)  # believed alive: whole minutes
        ended = T0 + timedelta(minutes=3, seconds=20)
        with store.transaction() as s:
            row = s.get(ClusterRow, "c1")
            assert row is not None and row.metered_until == T0 + timedelta(minutes=5)
            row.state, row.terminated_at = "TERMINATED", ended  # the backend says it ended back then
        with store.transaction() as s:
            row = s.get(ClusterRow, "c1")
            assert row is not None
            meter_cluster(s, row, T0 + timedelta(minutes=5, seconds=30), market)
        with store.transaction() as s:
            clusters = list(s.scalars(select(ClusterRow)))
            ledger = list(s.scalars(select(LedgerRow).order_by(LedgerRow.minute)))
        assert ledger_outside_cluster_life(clusters, ledger) == []
        assert [(r.minute - T0, r.seconds) for r in ledger] == [
            (timedelta(seconds=30), 30.0), (timedelta(minutes=1), 60.0), (timedelta(minutes=2), 60.0),
            (timedelta(minutes=3), 20.0)]
        assert clusters[0].metered_until == ended
    finally:
        store.dispose()
