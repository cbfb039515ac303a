"""Leader election: exactly one replica holds the lock and runs the scheduler and the engine.

On PostgreSQL the lock is a session-level advisory lock held by a dedicated connection (not one
of the pool's): the server releases it the moment that session ends, so a leader killed with
SIGKILL, or cut off from the database, gives it up without anyone's help. The holder checks the
session every few seconds, and before each engine step; a failed check is a lost leadership.
On SQLite (one machine, one file) the lock is an exclusive ``flock`` on a file in the broker home.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any, Protocol

from broker.runtime import EngineLock

log = logging.getLogger("broker.service.leader")

# pg advisory lock key: b"brokerld" as a signed 64-bit integer (stable across versions).
LEADER_KEY = int.from_bytes(b"brokerld", "big", signed=True)


class LeaderLock(Protocol):
    def try_acquire(self) -> bool: ...

    def check(self) -> bool: ...

    def release(self) -> None: ...


def libpq_url(url: str) -> str:
    scheme, rest = url.split("://", 1)
    return "postgresql://" + rest if scheme.startswith("postgresql") else url


class PostgresLeaderLock:
    def __init__(self, url: str, key: int = LEADER_KEY, timeout_s: float = 5.0) -> None:
        self.url = libpq_url(url)
        self.key = key
        self.timeout_s = timeout_s
        self._conn: Any = None
        self._held = False

    def _connect(self) -> Any:
        import psycopg

        # Keepalives and a user timeout: a partitioned leader's checks fail within seconds.
        return psycopg.connect(self.url, autocommit=True, connect_timeout=max(int(self.timeout_s), 1),
                               keepalives=1, keepalives_idle=5, keepalives_interval=2, keepalives_count=2,
                               tcp_user_timeout=int(self.timeout_s * 1000), application_name="broker-leader",
                               options=f"-c statement_timeout={int(self.timeout_s * 1000)}")

    def try_acquire(self) -> bool:
        if self._held:
            return self.check()
        try:
            if self._conn is None or self._conn.closed:
                self._conn = self._connect()
            row = self._conn.execute("SELECT pg_try_advisory_lock(%s)", (self.key,)).fetchone()
        except Exception as exc:
            log.warning("leader lock: cannot reach the database: %s", exc)
            self._drop()
            return False
        self._held = bool(row and row[0])
        return self._held

    def check(self) -> bool:
        if not self._held or self._conn is None:
            return False
        try:
            # A bigint advisory key shows in pg_locks as classid (high 32 bits), objid (low), objsubid 1.
            row = self._conn.execute(
                "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND pid = pg_backend_pid() AND granted"
                " AND classid = %s::bigint::oid AND objid = %s::bigint::oid AND objsubid = 1",
                ((self.key >> 32) & 0xFFFFFFFF, self.key & 0xFFFFFFFF)).fetchone()
        except Exception as exc:
            log.warning("leader lock: session lost: %s", exc)
            self._drop()
            return False
        if not row or row[0] < 1:
            self._drop()
            return False
        return True

    def release(self) -> None:
        if self._conn is not None and self._held:
            try:
                self._conn.execute("SELECT pg_advisory_unlock(%s)", (self.key,))
            except Exception as exc:
                log.debug("leader lock: unlock failed (the session's end releases it): %s", exc)
        self._drop()

    def _drop(self) -> None:
        self._held = False
        if self._conn is not None:
            try:
                self._conn.close()
            except Exception as exc:
                log.debug("leader lock: close failed: %s", exc)
            self._conn = None


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


def leader_lock(db_url: str, home: Path) -> LeaderLock:
    if db_url.startswith("postgresql"):
        return PostgresLeaderLock(db_url)
    return FileLeaderLock(home)
