"""Leader election: a lease in the store, with an epoch that every takeover moves on.

The lease is one row (``leader_lease``: holder, epoch, expires_at). A replica takes it by
compare-and-set when nobody holds it or it has expired, which adds one to the epoch; the holder
renews it every ``leader_check_seconds``, well before it runs out after ``lease_seconds(...)``.
A leader that stops renewing (SIGKILL, SIGSTOP, a GC pause, a stalled VM, a lost network) is
replaced once the lease expires; on SIGTERM it releases the lease at once.

The holder's own view of the lease runs on its monotonic clock, from the moment it *sent* each
renewal, so it always believes the lease ends before the database does: a process waking from a
stall finds its local view expired and stops before its next step or cloud call. What actually
keeps a stale leader out is the database: the engine writes through ``Store.fenced``, whose
every transaction re-checks holder and epoch on the lease row (see ``broker/store/db.py``).

On PostgreSQL the lease's times are the database's clock, so replicas' clocks need not agree.
On SQLite (one machine, one file) an exclusive ``flock`` in the broker home decides who leads,
as for the embedded engine; the lease row is then taken over unconditionally, for the epoch.
"""

from __future__ import annotations

import logging
import os
import secrets
import socket
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

from sqlalchemy import or_, select, text, update
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.orm import Session

from broker.runtime import EngineLock
from broker.store import Store
from broker.store.db import Fence
from broker.store.tables import LeaderLeaseRow

log = logging.getLogger("broker.service.leader")

LEASE = "engine"
LEASE_CHECKS = 5  # a lease lasts this many leader checks: four renewals can fail before it runs out


def lease_seconds(leader_check_seconds: float) -> float:
    return LEASE_CHECKS * leader_check_seconds


class FileLeaderLock:
    """SQLite: replicas can only share the store on one machine, so a file lock decides."""

    def __init__(self, home: Path) -> None:
        self._lock = EngineLock(home)
        self._held = False

    def try_acquire(self) -> bool:
        if not self._held:
            self._held = self._lock.acquire()
        return self._held

    def check(self) -> bool:
        return self._held

    def release(self) -> None:
        if self._held:
            self._lock.release()
            self._held = False


class LeaseLock:
    """This process's side of the leader lease: take it, renew it, release it, and fence by it."""

    def __init__(self, store: Store, ttl_s: float, holder: str | None = None,
                 gate: FileLeaderLock | None = None) -> None:
        self.store = store
        self.ttl_s = ttl_s
        self.holder = holder or f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(4)}"
        self.gate = gate
        self.epoch: int | None = None
        # The local view ends this far before the database's, for clocks that tick at slightly different rates.
        self.margin_s = min(1.0, ttl_s * 0.1)
        self._deadline = 0.0  # time.monotonic() past which this process no longer believes it leads
        self._closed = False  # set on SIGTERM: never lead again

    # ----------------------------------------------------------------- the local view

    def check(self) -> bool:
        return self.epoch is not None and not self._closed and time.monotonic() < self._deadline

    def holds(self, epoch: int) -> bool:
        return self.epoch == epoch and self.check()

    @property
    def fence(self) -> Fence:
        epoch = self.epoch
        if epoch is None:
            raise RuntimeError("fence asked for without the lease")
        return Fence(LEASE, self.holder, epoch, held=lambda: self.holds(epoch),
                     idle_timeout_s=max(self.ttl_s / 2, 1.0))

    def remaining_s(self) -> float:
        return max(self._deadline - time.monotonic(), 0.0) if self.check() else 0.0

    def close(self) -> None:
        """Fence this process at once (safe in a signal handler); ``release`` then tells the database."""
        self._closed = True

    # ----------------------------------------------------------------- the database

    def try_acquire(self) -> bool:
        if self.check():
            return self.renew()
        self.epoch = None
        if self._closed or (self.gate is not None and not self.gate.try_acquire()):
            return False
        sent = time.monotonic()
        try:
            with self.store.transaction() as s:
                if self.gate is None and self._held_by_another(s):
                    return False  # without locking the row: that would hold up the leader's writes
                self._wait_out_writes(s)
                now = self._now(s)
                takeable = LeaderLeaseRow.name == LEASE
                if self.gate is None:
                    takeable &= or_(LeaderLeaseRow.holder.is_(None), LeaderLeaseRow.expires_at <= now,
                                    LeaderLeaseRow.holder == self.holder)
                taken = s.execute(update(LeaderLeaseRow).where(takeable).values(
                    holder=self.holder, epoch=LeaderLeaseRow.epoch + 1, expires_at=now + timedelta(seconds=self.ttl_s),
                    acquired_at=now, renewed_at=now)).rowcount  # type: ignore[attr-defined]
                epoch = s.scalar(select(LeaderLeaseRow.epoch).where(LeaderLeaseRow.name == LEASE)) if taken else None
        except SQLAlchemyError as exc:
            log.warning("leader lease: cannot take it: %s", _first_line(exc))
            return False
        if epoch is None:
            return False
        self.epoch = epoch
        self._deadline = sent + self.ttl_s - self.margin_s
        return True

    def renew(self) -> bool:
        """Push the lease's end on; False when it is lost (someone else took it, or it ran out here)."""
        epoch = self.epoch
        if epoch is None or not self.check():
            self.epoch = None
            return False
        sent = time.monotonic()
        try:
            with self.store.transaction() as s:
                now = self._now(s)
                renewed = s.execute(update(LeaderLeaseRow).where(
                    LeaderLeaseRow.name == LEASE, LeaderLeaseRow.holder == self.holder,
                    LeaderLeaseRow.epoch == epoch).values(expires_at=now + timedelta(seconds=self.ttl_s),
                                                          renewed_at=now)).rowcount  # type: ignore[attr-defined]
        except SQLAlchemyError as exc:
            # A missed renewal is not a lost lease: keep leading until the local view runs out.
            log.warning("leader lease: renewal failed (%.1f s left): %s", self.remaining_s(), _first_line(exc))
            return self.check()
        if not renewed:
            self.epoch = None
            return False
        if self.epoch == epoch:
            self._deadline = sent + self.ttl_s - self.margin_s
        return True

    def release(self) -> None:
        """Give the lease up in the database (after ``close``, or on losing it); the local view ends first."""
        epoch, self.epoch = self.epoch, None
        if epoch is not None:
            try:
                with self.store.transaction() as s:
                    self._wait_out_writes(s)
                    now = self._now(s)
                    s.execute(update(LeaderLeaseRow).where(
                        LeaderLeaseRow.name == LEASE, LeaderLeaseRow.holder == self.holder,
                        LeaderLeaseRow.epoch == epoch).values(holder=None, expires_at=now))
            except SQLAlchemyError as exc:
                log.warning("leader lease: release failed (it expires by itself): %s", _first_line(exc))
        if self.gate is not None:
            self.gate.release()

    def _held_by_another(self, s: Session) -> bool:
        row = s.get(LeaderLeaseRow, LEASE)
        return row is not None and row.holder not in (None, self.holder) and row.expires_at > self._now(s)

    def _wait_out_writes(self, s: Session) -> None:
        """Lock the lease row against every fenced transaction still under way (they hold it FOR KEY SHARE)."""
        if self.store.dialect == "postgresql":
            # Wait a moment at most behind a stalled transaction that still holds the row.
            s.execute(text("SET LOCAL lock_timeout = '2s'"))
        s.execute(select(LeaderLeaseRow.name).where(LeaderLeaseRow.name == LEASE).with_for_update())

    def _now(self, s: Session) -> datetime:
        if self.store.dialect == "postgresql":
            s.execute(text("SET LOCAL lock_timeout = '2s'"))
            value = s.scalar(text("SELECT clock_timestamp()"))
            assert isinstance(value, datetime)
            return value.astimezone(UTC)
        return datetime.now(UTC)


def _first_line(exc: BaseException) -> str:
    return str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__


def leader_lock(store: Store, home: Path, ttl_s: float) -> LeaseLock:
    gate = None if store.dialect == "postgresql" else FileLeaderLock(home)
    return LeaseLock(store, ttl_s, gate=gate)
