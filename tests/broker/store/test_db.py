from __future__ import annotations

import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path

import pytest
from sqlalchemy import func, inspect, select, text
from sqlalchemy.exc import IntegrityError

from broker.store import open_store
from broker.store.tables import ClusterRow, JobRow, LedgerRow


def _job(job_id: str) -> JobRow:
    now = datetime(2026, 1, 1, tzinfo=UTC)
    return JobRow(id=job_id, name="t", team="nlp", state="PENDING", priority=500, spec={"run": "x"},
                  backend="local", num_nodes=2, gpus_per_node=1, checkpoint_dir="/tmp/c",
                  created_at=now, updated_at=now, zones=[])


def _cluster(cluster_id: str, job_id: str) -> ClusterRow:
    now = datetime(2026, 1, 1, tzinfo=UTC)
    return ClusterRow(id=cluster_id, launch_key=f"{job_id}:1", job_id=job_id, backend="local", cloud="aws",
                      region="us-east-1", zone="us-east-1a", instance_type="p3.2xlarge", accelerator="V100",
                      gpus_per_node=1, num_nodes=2, spot=True, price_per_node_hour=0.9,
                      on_demand_price_per_node_hour=3.06, state="UP", created_at=now, handle={})


def test_migrations_create_every_table(db_url: str) -> None:
    store = open_store(db_url)
    names = set(inspect(store.engine).get_table_names())
    assert {"jobs", "job_events", "clusters", "allocations", "notices", "ledger", "alembic_version"} <= names
    # Opening again is a no-op, not a second migration.
    open_store(db_url).dispose()
    store.dispose()


def test_datetimes_round_trip_as_utc(db_url: str) -> None:
    store = open_store(db_url)
    with store.transaction() as s:
        s.add(_job("j1"))
    with store.transaction() as s:
        row = s.get(JobRow, "j1")
        assert row is not None and row.created_at == datetime(2026, 1, 1, tzinfo=UTC)
        assert row.created_at.tzinfo is not None
    store.dispose()


def test_ledger_minute_is_counted_once(db_url: str) -> None:
    store = open_store(db_url)
    minute = datetime(2026, 1, 1, 0, 5, tzinfo=UTC)
    with store.transaction() as s:
        s.add(_job("j1"))
        s.flush()
        s.add(_cluster("c1", "j1"))
    entry = dict(cluster_id="c1", minute=minute, holder="job:j1", job_id="j1", usage="running", cloud="aws",
                 region="us-east-1", zone="us-east-1a", instance_type="p3.2xlarge", accelerator="V100",
                 nodes=2, gpus=2, spot=True, price_per_node_hour=0.9, on_demand_price_per_node_hour=3.06,
                 cost=0.03, on_demand_cost=0.102)
    with store.transaction() as s:
        s.add(LedgerRow(**entry))
    with pytest.raises(IntegrityError), store.transaction() as s:
        s.add(LedgerRow(**entry))
    with store.transaction() as s:
        assert s.scalar(select(func.count()).select_from(LedgerRow)) == 1
    store.dispose()


def test_failed_transaction_writes_nothing(db_url: str) -> None:
    store = open_store(db_url)
    with pytest.raises(RuntimeError), store.transaction() as s:
        s.add(_job("j2"))
        s.flush()
        raise RuntimeError("crash mid-step")
    with store.transaction() as s:
        assert s.get(JobRow, "j2") is None
    store.dispose()


def test_processes_opening_a_new_sqlite_store_at_once_migrate_it_once(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'fresh.db'}"
    code = f"from broker.store import open_store; open_store({url!r}).dispose()"
    processes = [subprocess.Popen([sys.executable, "-c", code], stderr=subprocess.PIPE, text=True) for _ in range(4)]
    errors = [p.communicate(timeout=120)[1] for p in processes]
    assert [p.returncode for p in processes] == [0, 0, 0, 0], errors
    store = open_store(url)
    assert {"jobs", "ledger"} <= set(inspect(store.engine).get_table_names())
    store.dispose()


def test_the_write_count_moves_on_writes_and_not_on_reads(tmp_path: Path) -> None:
    store = open_store(f"sqlite:///{tmp_path / 'store.db'}")
    try:
        store.migrate()
        before = store.writes.count
        with store.transaction() as s:
            s.scalar(select(func.count()).select_from(JobRow))
            s.execute(text("  SELECT 1"))
        assert store.writes.count == before
        with store.transaction() as s:
            s.execute(text("CREATE TEMP TABLE scratch (x INTEGER)"))  # not a plain read: counted
            s.execute(text("insert into scratch values (1)"))
            s.execute(text("WITH v AS (SELECT 2 AS x) INSERT INTO scratch SELECT x FROM v"))
        assert store.writes.count == before + 3
    finally:
        store.dispose()
