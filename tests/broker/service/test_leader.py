"""The leader lease and the fenced store, on SQLite and real PostgreSQL, and the scheduler's stored jobs."""

from __future__ import annotations

import random
import threading
import time
from datetime import UTC, datetime
from pathlib import Path

import pytest
from sqlalchemy import select, text

from broker.config.settings import load_settings
from broker.service.leader import LEASE, FileLeaderLock, LeaseLock, leader_lock
from broker.service.runner import build_scheduler, build_ticker, start_scheduler
from broker.store import Store, open_store
from broker.store.db import Fence, Fenced
from broker.store.tables import JobEventRow, JobRow, LeaderLeaseRow

NOW = datetime(2026, 1, 1, tzinfo=UTC)


def add_job(store: Store, job_id: str = "j1") -> None:
    with store.transaction() as s:
        s.add(JobRow(id=job_id, name=job_id, state="PENDING", spec={}, checkpoint_dir="/tmp/ck",
                     created_at=NOW, updated_at=NOW))


def lease_row(store: Store) -> LeaderLeaseRow:
    with store.transaction() as s:
        row = s.get(LeaderLeaseRow, LEASE)
        assert row is not None
        return row


def liar(fence: Fence, idle_timeout_s: float | None = None) -> Fence:
    """The same tenure, seen by a process that believes it still leads (it slept through its deadline)."""
    return Fence(fence.lease, fence.holder, fence.epoch, held=lambda: True,
                 idle_timeout_s=idle_timeout_s or fence.idle_timeout_s)


def test_one_holder_until_it_expires_and_every_takeover_is_a_new_epoch(db_url: str) -> None:
    store = open_store(db_url)
    first, second = LeaseLock(store, ttl_s=1.5, holder="a"), LeaseLock(store, ttl_s=1.5, holder="b")
    try:
        assert first.try_acquire() and first.epoch == 1
        assert not second.try_acquire()
        assert lease_row(store).holder == "a"
        time.sleep(0.8)
        assert first.renew() and first.check()  # renewed well before it runs out: still "a", same epoch
        time.sleep(0.8)
        assert not second.try_acquire() and lease_row(store).epoch == 1
        time.sleep(1.8)  # "a" stops renewing (a stall): its own view ends before the database's
        assert not first.check()
        assert second.try_acquire() and second.epoch == 2
        row = lease_row(store)
        assert (row.holder, row.epoch) == ("b", 2)
        assert not first.renew()  # it wakes: the lease is someone else's
        assert not first.try_acquire()
        second.release()
        assert lease_row(store).holder is None
        assert first.try_acquire() and first.epoch == 3  # a released lease is taken at once
    finally:
        first.release()
        store.dispose()


def test_a_closed_lease_fences_at_once_and_is_never_taken_again(db_url: str) -> None:
    store = open_store(db_url)
    lock = LeaseLock(store, ttl_s=30, holder="a")
    try:
        assert lock.try_acquire()
        fence = lock.fence
        fence.ensure()
        lock.close()  # what SIGTERM does, before anything else
        with pytest.raises(Fenced):
            fence.ensure()
        with pytest.raises(Fenced), store.fenced(fence).transaction():
            pass
        lock.release()
        assert lease_row(store).holder is None
        assert not lock.try_acquire()
    finally:
        store.dispose()


def test_a_stale_epochs_write_is_refused_by_the_database(db_url: str) -> None:
    store = open_store(db_url)
    add_job(store)
    old, new = LeaseLock(store, ttl_s=1.0, holder="old"), LeaseLock(store, ttl_s=30, holder="new")
    try:
        assert old.try_acquire()
        stale = liar(old.fence)
        with store.fenced(stale).transaction() as s:
            job = s.get(JobRow, "j1")
            assert job is not None
            job.state = "PROVISIONING"
            s.add(JobEventRow(job_id="j1", at=NOW, kind="transition", from_state="PENDING", to_state="PROVISIONING"))
        time.sleep(1.2)
        # Expired and not yet taken over: still refused (the lease's end is the database's clock).
        with pytest.raises(Fenced, match="refused"), store.fenced(stale).transaction() as s:
            s.add(JobEventRow(job_id="j1", at=NOW, kind="late"))
        assert new.try_acquire() and new.epoch == 2
        with pytest.raises(Fenced, match="refused"), store.fenced(stale).transaction() as s:
            job = s.get(JobRow, "j1")
            assert job is not None
            job.state = "RUNNING"
            s.add(JobEventRow(job_id="j1", at=NOW, kind="transition", from_state="PROVISIONING", to_state="RUNNING"))
        with store.fenced(new.fence).transaction() as s:
            s.add(JobEventRow(job_id="j1", at=NOW, kind="taken_over"))
        with store.transaction() as s:
            job = s.get(JobRow, "j1")
            events = [(e.kind, e.epoch) for e in s.scalars(select(JobEventRow).order_by(JobEventRow.id))]
        assert job is not None and (job.state, job.epoch) == ("PROVISIONING", 1)
        assert events == [("transition", 1), ("taken_over", 2)]  # every engine write carries its epoch
    finally:
        new.release()
        store.dispose()


def test_a_takeover_waits_for_a_write_that_passed_the_check_and_the_next_one_is_refused(postgres_url: str) -> None:
    store = open_store(postgres_url)
    add_job(store)
    old, new = LeaseLock(store, ttl_s=1.0, holder="old"), LeaseLock(store, ttl_s=30, holder="new")
    try:
        assert old.try_acquire()
        stale = liar(old.fence, idle_timeout_s=30)
        with store.fenced(stale).transaction() as s:
            # The lease runs out while this write is under way: the takeover cannot commit before it ends.
            time.sleep(1.2)
            assert not new.try_acquire()  # waited for the lease row (lock_timeout), then gave up
            s.add(JobEventRow(job_id="j1", at=NOW, kind="in_flight"))
        assert new.try_acquire() and new.epoch == 2
        with pytest.raises(Fenced), store.fenced(stale).transaction() as s:
            s.add(JobEventRow(job_id="j1", at=NOW, kind="stale"))
        with store.transaction() as s:
            assert [e.kind for e in s.scalars(select(JobEventRow))] == ["in_flight"]
    finally:
        new.release()
        store.dispose()


def test_a_leader_stalled_inside_a_transaction_does_not_hold_up_the_takeover(postgres_url: str) -> None:
    store = open_store(postgres_url)
    add_job(store)
    old, new = LeaseLock(store, ttl_s=2.0, holder="old"), LeaseLock(store, ttl_s=30, holder="new")
    try:
        assert old.try_acquire()
        assert old.fence.idle_timeout_s == 1.0
        with pytest.raises(Exception, match=r"idle-in-transaction|terminat|closed"), \
                store.fenced(liar(old.fence)).transaction() as s:
            job = s.get(JobRow, "j1", with_for_update=True)  # holds the job's row, as a step does
            deadline = time.monotonic() + 10
            while not new.try_acquire():  # the stalled session is ended by the server, then it is taken
                assert time.monotonic() < deadline, "the takeover waited on a stalled transaction"
                time.sleep(0.2)
            assert job is not None
            job.state = "RUNNING"
        assert new.epoch == 2
        with store.fenced(new.fence).transaction() as s:
            job = s.get(JobRow, "j1", with_for_update=True)  # the job's row is free again
            assert job is not None and job.state == "PENDING"
    finally:
        new.release()
        store.dispose()


def test_two_engines_racing_never_write_out_of_epoch_order(db_url: str) -> None:
    """Two leaders that stall and steal the lease from each other; the writes' epochs never go back."""
    store = open_store(db_url)
    add_job(store)
    stop = time.monotonic() + 4.0
    refused: dict[str, int] = {"a": 0, "b": 0}
    errors: list[BaseException] = []

    def engine(name: str, seed: int) -> None:
        rng = random.Random(seed)
        lock = LeaseLock(store, ttl_s=0.4, holder=name)
        try:
            while time.monotonic() < stop:
                if lock.epoch is None and not lock.try_acquire():
                    time.sleep(rng.uniform(0.01, 0.1))
                    continue
                fence = liar(lock.fence)  # its own clock never stops it: only the database can
                try:
                    with store.fenced(fence).transaction() as s:
                        job = s.get(JobRow, "j1", with_for_update=True)
                        assert job is not None
                        job.attempt += 1  # a sequence in commit order
                        s.add(JobEventRow(job_id="j1", at=NOW, kind="write", detail={"seq": job.attempt}))
                        time.sleep(rng.choice([0.0, 0.0, 0.05, 0.5]))  # sometimes a stall past the lease
                except Fenced:
                    refused[name] += 1
                    lock.epoch = None
                    time.sleep(rng.uniform(0.0, 0.3))
                except Exception as exc:  # SQLite: a writer that lost the race to a takeover is refused too
                    if "locked" not in str(exc) and "could not serialize" not in str(exc):
                        raise
        except BaseException as exc:
            errors.append(exc)
        finally:
            lock.release()

    threads = [threading.Thread(target=engine, args=(name, seed)) for seed, name in enumerate("ab")]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    try:
        assert not errors, errors
        with store.transaction() as s:
            writes = sorted((e.detail["seq"], e.epoch) for e in s.scalars(select(JobEventRow)))
            epochs_taken = lease_row(store).epoch
        epochs = [epoch for _, epoch in writes]
        assert [seq for seq, _ in writes] == list(range(1, len(writes) + 1))
        assert epochs == sorted(epochs), "a stale leader wrote after its successor"
        assert epochs_taken >= 3 and len(set(epochs)) >= 3 and sum(refused.values()) >= 1, (epochs_taken, refused)
    finally:
        store.dispose()


def test_sqlite_leadership_is_the_file_lock_and_the_lease_gives_the_epoch(tmp_path: Path) -> None:
    store = open_store(f"sqlite:///{tmp_path / 'store.db'}")
    first, second = leader_lock(store, tmp_path, 30), leader_lock(store, tmp_path, 30)
    try:
        assert first.try_acquire() and not second.try_acquire()
        first.release()
        assert second.try_acquire() and second.epoch == 2
        plain = FileLeaderLock(tmp_path)  # the embedded engine's lock is the same one
        assert not plain.try_acquire()
    finally:
        second.release()
        store.dispose()


def test_the_lease_row_is_made_by_the_migration(db_url: str) -> None:
    store = open_store(db_url)
    try:
        with store.engine.connect() as conn:
            rows = list(conn.execute(text("SELECT name, holder, epoch FROM leader_lease")))
        assert [tuple(r) for r in rows] == [("engine", None, 0)]
    finally:
        store.dispose()


def test_scheduler_keeps_its_jobs_in_the_store_and_drops_stale_ones(db_url: str) -> None:
    store = open_store(db_url)
    settings = load_settings(price_poll_seconds={"aws": 120}, policy_schedules=[
        {"name": "day", "cron": "0 8 * * MON-FRI", "queue_priority": {"training": 300}}])
    old = build_scheduler(store, load_settings(price_poll_seconds={"aws": 120, "azure": 60}))
    start_scheduler(old)
    old.pause()
    old.add_job(id="engine-step", name="engine-step", func=print, trigger="interval", seconds=60,
                replace_existing=True)  # where an older leader kept it: in the store
    old.shutdown(wait=False)
    scheduler = build_scheduler(store, settings)
    start_scheduler(scheduler)
    scheduler.pause()  # keep the tasks from running: this test looks at the schedule only
    try:
        with store.engine.connect() as conn:
            stored = {row[0]: row[1] for row in conn.execute(text("SELECT id, next_run_time FROM apscheduler_jobs"))}
        # The engine's tick is the ticker's, in memory (not rewritten in the store five times a second); a
        # stored copy that an older leader left is dropped.
        assert set(stored) == {"reconcile", "reports", "prices-aws", "policy-day"}
        assert [job.id for job in build_ticker(settings).get_jobs()] == ["engine-step"]
        day = scheduler.get_job("policy-day")
        after = datetime(2026, 3, 6, 9, tzinfo=UTC)  # a Friday, 09:00
        assert day.trigger.get_next_fire_time(None, after) == datetime(2026, 3, 9, 8, tzinfo=UTC)
        assert scheduler.get_job("prices-aws").args == ("aws",)
    finally:
        scheduler.shutdown(wait=False)
        store.dispose()
