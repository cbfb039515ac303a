"""One writer of notices: once per cluster and kind, whoever reports first; a later report may only
add a newer checkpoint; what the store's columns cannot hold is refused naming the field."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from sqlalchemy import select

from broker.clock import WallClock
from broker.engine.notices import record_backend_notice
from broker.notices.record import Notice, record_notice
from broker.store import Store, open_store
from broker.store.tables import ClusterRow, JobRow, NoticeRow


def _cluster(store: Store) -> None:
    """The cluster c1 of job j1, as the engine would have launched it."""
    now = datetime.now(UTC)
    with store.transaction() as s:
        s.add(JobRow(id="j1", name="t", team="a", state="RUNNING", priority=500, spec={}, backend="local",
                     num_nodes=1, gpus_per_node=1, checkpoint_dir="/c", created_at=now, updated_at=now, zones=[]))
        s.flush()
        s.add(ClusterRow(id="c1", launch_key="j1:1", job_id="j1", backend="local", cloud="local", region="r",
                         zone="z", instance_type="t", gpus_per_node=1, num_nodes=1, spot=True, price_per_node_hour=1.0,
                         on_demand_price_per_node_hour=3.0, state="UP", token_hash="x", handle={}, created_at=now))


def test_the_backend_first_then_agents_adding_only_a_newer_checkpoint(tmp_path: Path) -> None:
    store = open_store(f"sqlite:///{tmp_path / 'broker.db'}")
    clock = WallClock()
    try:
        _cluster(store)
        at = datetime.now(UTC) + timedelta(minutes=2)
        record_backend_notice(store, clock, "c1", at)
        record_backend_notice(store, clock, "c1", at)  # the next step sees it again: still one row
        newer = Notice("c1", "terminate", node="0", checkpoint="/ckpt/step-2",
                       detail={"checkpoint_at": "2026-11-21T10:00:02+00:00"})
        older = Notice("c1", "terminate", node="1", checkpoint="/ckpt/step-1",
                       detail={"checkpoint_at": "2026-11-21T10:00:01+00:00"})
        first = record_notice(store, clock, newer, source="agent")
        second = record_notice(store, clock, older, source="agent")
        assert first.duplicate and second.duplicate and first.notice_id == second.notice_id
        with store.transaction() as s:
            (row,) = s.scalars(select(NoticeRow))
            assert (row.dedup_key, row.source, row.node, row.checkpoint) == ("c1:terminate", "backend", "*",
                                                                            "/ckpt/step-2")
            assert row.detail == {"checkpoint_at": "2026-11-21T10:00:02+00:00"}
        rebalance = record_notice(store, clock, Notice("c1", "rebalance", node="0"), source="sqs")
        assert not rebalance.duplicate  # another kind of notice for the same cluster
    finally:
        store.dispose()


@pytest.mark.parametrize(("fields", "said"), [
    ({"kind": "explode"}, "kind: expected one of"),
    ({"cluster_id": ""}, "cluster_id: empty"),
    ({"cluster_id": "c" * 65}, "cluster_id: at most 64 characters"),
    ({"node": "n" * 101}, "node: at most 100 characters"),
    ({"node": "i-1\x00"}, "node: contains a NUL byte"),
    ({"checkpoint": "/c" * 3000}, "checkpoint: at most 4096 characters"),
])
def test_what_the_columns_cannot_hold_is_refused_naming_the_field(fields: dict[str, str], said: str) -> None:
    with pytest.raises(ValueError, match=said):
        Notice(**{"cluster_id": "c1", "kind": "terminate", **fields})  # type: ignore[arg-type]
