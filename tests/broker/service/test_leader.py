"""The leader lock on real PostgreSQL (and the file lock on SQLite), and the scheduler's stored jobs."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import psycopg
from sqlalchemy import text

from broker.config import load_settings
from broker.service.leader import FileLeaderLock, PostgresLeaderLock, libpq_url
from broker.service.runner import build_scheduler, start_scheduler
from broker.store import open_store


def test_one_holder_and_a_lost_session_is_lost_leadership(postgres_url: str) -> None:
    first, second = PostgresLeaderLock(postgres_url), PostgresLeaderLock(postgres_url)
    try:
        assert first.try_acquire() is True
        assert second.try_acquire() is False
        assert first.check() is True and second.check() is False
        # The leader's session ends (its process died, or the network cut it off).
        with psycopg.connect(libpq_url(postgres_url), autocommit=True) as admin:
            admin.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                          "WHERE application_name = 'broker-leader' AND datname = current_database() "
                          "AND pid IN (SELECT pid FROM pg_locks WHERE locktype = 'advisory')")
        assert first.check() is False
        assert second.try_acquire() is True and second.check() is True
        assert first.try_acquire() is False
    finally:
        first.release()
        second.release()


def test_release_hands_the_lock_over(postgres_url: str) -> None:
    first, second = PostgresLeaderLock(postgres_url), PostgresLeaderLock(postgres_url)
    try:
        assert first.try_acquire()
        first.release()
        assert second.try_acquire()
    finally:
        second.release()


def test_file_lock_on_sqlite(tmp_path: Path) -> None:
    first, second = FileLeaderLock(tmp_path), FileLeaderLock(tmp_path)
    assert first.try_acquire() and not second.try_acquire()
    first.release()
    assert second.try_acquire()
    second.release()


def test_scheduler_keeps_its_jobs_in_the_store_and_drops_stale_ones(db_url: str) -> None:
    store = open_store(db_url)
    settings = load_settings(price_poll_seconds={"aws": 120}, policy_schedules=[
        {"name": "day", "cron": "0 8 * * MON-FRI", "queue_priority": {"training": 300}}])
    old = build_scheduler(store, load_settings(price_poll_seconds={"aws": 120, "azure": 60}))
    start_scheduler(old)
    old.pause()
    old.shutdown(wait=False)
    scheduler = build_scheduler(store, settings)
    start_scheduler(scheduler)
    scheduler.pause()  # keep the tasks from running: this test looks at the schedule only
    try:
        with store.engine.connect() as conn:
            stored = {row[0]: row[1] for row in conn.execute(text("SELECT id, next_run_time FROM apscheduler_jobs"))}
        assert set(stored) == {"engine-step", "reconcile", "reports", "prices-aws", "policy-day"}
        day = scheduler.get_job("policy-day")
        after = datetime(2026, 3, 6, 9, tzinfo=UTC)  # a Friday, 09:00
        assert day.trigger.get_next_fire_time(None, after) == datetime(2026, 3, 9, 8, tzinfo=UTC)
        assert scheduler.get_job("prices-aws").args == ("aws",)
    finally:
        scheduler.shutdown(wait=False)
        store.dispose()
