from __future__ import annotations

from alembic import command
from sqlalchemy import inspect

from broker.store import open_store
from broker.store.db import alembic_config

REPORT_TABLES = {"report_deliveries", "report_runs", "budget_alerts"}


def test_reports_migration_upgrades_and_downgrades(db_url: str) -> None:
    store = open_store(db_url)
    assert set(inspect(store.engine).get_table_names()) >= REPORT_TABLES
    with store.engine.begin() as conn:
        config = alembic_config(db_url)
        config.attributes["connection"] = conn
        command.downgrade(config, "0001")
    names = set(inspect(store.engine).get_table_names())
    assert not REPORT_TABLES & names and "ledger" in names
    store.dispose()
    store = open_store(db_url)  # back to head
    assert set(inspect(store.engine).get_table_names()) >= REPORT_TABLES
    store.dispose()
