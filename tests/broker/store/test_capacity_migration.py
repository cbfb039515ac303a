from __future__ import annotations

from alembic import command
from sqlalchemy import inspect

from broker.store import open_store
from broker.store.db import alembic_config

SIGNALS = {"obtainability", "estimated_uptime_s", "placement_level"}


def _columns(store: object) -> set[str]:
    return {c["name"] for c in inspect(store.engine).get_columns("price_quotes")}  # type: ignore[attr-defined]


def test_capacity_signal_columns_upgrade_and_downgrade(db_url: str) -> None:
    store = open_store(db_url)
    assert _columns(store) >= SIGNALS | {"capacity_score", "spot_price"}
    with store.engine.begin() as conn:
        conn.exec_driver_sql(
            "INSERT INTO price_quotes (cloud, region, zone, instance_type, accelerator, gpus_per_node, spot_price, "
            "on_demand_price, capacity_score, obtainability, stale, observed_at, confirmed_at) VALUES ('gcp', "
            "'us-central1', 'us-central1-a', 'a3-highgpu-8g', 'H100', 8, 20.0, 88.0, NULL, 0.8, false, "
            "'2026-03-01 12:00:00+00:00', '2026-03-01 12:00:00+00:00')")
        config = alembic_config(db_url)
        config.attributes["connection"] = conn
        command.downgrade(config, "0015_gpu_minutes")
    assert not _columns(store) & SIGNALS
    with store.engine.connect() as conn:  # the quote itself is kept
        assert conn.exec_driver_sql("SELECT spot_price FROM price_quotes").scalar_one() == 20.0
    store.dispose()
    store = open_store(db_url)  # back to head
    assert _columns(store) >= SIGNALS
    with store.engine.connect() as conn:
        assert conn.exec_driver_sql("SELECT obtainability FROM price_quotes").scalar_one() is None
    store.dispose()


def test_the_preemption_rate_column_upgrades_and_downgrades(db_url: str) -> None:
    store = open_store(db_url)
    assert "preemption_rate" in _columns(store)
    with store.engine.begin() as conn:
        config = alembic_config(db_url)
        config.attributes["connection"] = conn
        command.downgrade(config, "0016_capacity_signals")
    assert "preemption_rate" not in _columns(store) and _columns(store) >= SIGNALS
    store.dispose()
    store = open_store(db_url)
    assert "preemption_rate" in _columns(store)
    store.dispose()
