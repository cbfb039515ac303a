"""An embedded SQLite store read with the standard library's ``sqlite3``, read-only: ``broker status``.

Importing SQLAlchemy costs about a second on a small machine, more than everything else ``status``
does. So when the store is the embedded SQLite file and already at the newest migration (its
``alembic_version`` row against ``broker.store.revision``), ``status`` reads it here; any other store
(PostgreSQL, a file not there yet or behind a migration, an unusual URL) returns None from
``open_readonly`` and is read through SQLAlchemy, which creates and migrates it. The queries are the
ones ``broker.status.orm_source`` has SQLAlchemy write, and each column is converted as the table's
SQLAlchemy type converts it (by the type SQLite declares for it), so both give the same summaries;
``tests/broker/store/test_readonly.py`` holds them to it.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from broker.model import ACTIVE_STATES, LIVE_CLUSTER_STATES
from broker.store.revision import head_revision

if TYPE_CHECKING:
    from broker.status.progress import Span
    from broker.status.summary import Allocation, Cluster, Job, Prediction, Progress

_PREFIX = "sqlite:///"
# What reading a store that is not as the migrations left it raises (a value no column type reads).
READ_ERRORS = (sqlite3.Error, ValueError, TypeError)


def _utc(value: str) -> datetime:
    """What ``UtcDateTime`` reads from SQLite: the stored text as a datetime, in UTC."""
    parsed = datetime.fromisoformat(value)
    return parsed.replace(tzinfo=UTC) if parsed.tzinfo is None else parsed.astimezone(UTC)


# By the column type SQLite declares (the DDL SQLAlchemy wrote): UtcDateTime, JSON and Boolean.
_CONVERT: dict[str, Callable[[Any], Any]] = {"DATETIME": _utc, "JSON": json.loads, "BOOLEAN": bool}


class Row:
    """One row of a table, its columns as attributes, converted as the ORM's would be."""

    __slots__ = ("_values",)

    def __init__(self, values: dict[str, Any]) -> None:
        self._values = values

    def __getattr__(self, name: str) -> Any:
        try:
            return self._values[name]
        except KeyError:
            raise AttributeError(name) from None


def sqlite_path(url: str) -> Path | None:
    """The file of a plain ``sqlite:///PATH`` URL; None for anything else (read through SQLAlchemy)."""
    if not url.startswith(_PREFIX):
        return None
    path = url[len(_PREFIX):]
    if not path or path == ":memory:" or any(c in path for c in "?%#\0"):
        return None
    return Path(path)


def open_readonly(url: str) -> ReadOnlyStore | None:
    """The store at ``url`` opened read-only, if it is an embedded SQLite file at the newest migration."""
    path = sqlite_path(url)
    head = head_revision()
    if path is None or head is None or not path.is_file():
        return None
    try:
        conn = sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True, timeout=30,
                               isolation_level=None, check_same_thread=False)
    except sqlite3.Error:
        return None
    try:
        conn.execute("PRAGMA busy_timeout=30000")
        found = conn.execute("SELECT version_num FROM alembic_version").fetchone()
    except sqlite3.Error:  # no alembic_version table: a file no broker migrated
        found = None
    if found is None or found[0] != head:
        conn.close()
        return None
    return ReadOnlyStore(conn)


class ReadOnlyStore:
    """``broker.status.summary.SummarySource`` over a read-only ``sqlite3`` connection, plus what ``status`` asks."""

    def __init__(self, conn: sqlite3.Connection) -> None:
        self.conn = conn
        self.memo: dict[str, Any] = {}
        self._converters: dict[str, dict[str, Callable[[Any], Any]]] = {}

    def close(self) -> None:
        self.conn.close()

    @contextmanager
    def snapshot(self) -> Iterator[ReadOnlyStore]:
        """Every read inside sees the store as it was at the first one (one read transaction)."""
        self.conn.execute("BEGIN")
        try:
            yield self
        finally:
            self.conn.execute("COMMIT")

    def _convert(self, table: str) -> dict[str, Callable[[Any], Any]]:
        if table not in self._converters:
            declared = self.conn.execute(f"PRAGMA table_info({table})").fetchall()
            self._converters[table] = {name: _CONVERT[kind.upper()] for _, name, kind, *_ in declared
                                       if kind.upper() in _CONVERT}
        return self._converters[table]

    def _rows(self, table: str, sql: str, *params: Any) -> list[Row]:
        convert = self._convert(table)
        cursor = self.conn.execute(f"SELECT * FROM {table} {sql}", params)
        names = [d[0] for d in cursor.description]
        return [Row({name: (convert[name](value) if value is not None and name in convert else value)
                     for name, value in zip(names, values, strict=True)}) for values in cursor.fetchall()]

    def _first(self, table: str, sql: str, *params: Any) -> Any:
        rows = self._rows(table, sql, *params)
        return rows[0] if rows else None

    def jobs(self, state: str | None = None, newest: int | None = None) -> list[Job]:
        where, params = ("WHERE jobs.state = ? ", (state,)) if state is not None else ("", ())
        if newest is None:
            return cast("list[Job]", self._rows("jobs", f"{where}ORDER BY jobs.created_at", *params))
        rows = self._rows("jobs", f"{where}ORDER BY jobs.created_at DESC, jobs.id DESC LIMIT ?", *params, newest)
        return cast("list[Job]", rows[::-1])

    def job(self, job_id: str) -> Job | None:
        return cast("Job | None", self._first("jobs", "WHERE jobs.id = ?", job_id))

    def costs(self, job_id: str) -> tuple[float, float]:
        cost, on_demand = self.conn.execute(
            "SELECT coalesce(sum(ledger.cost), ?), coalesce(sum(ledger.on_demand_cost), ?) FROM ledger "
            "WHERE ledger.job_id = ?", (0.0, 0.0, job_id)).fetchone()
        return cost, on_demand

    def gpu(self, job_id: str) -> tuple[float, float, float | None]:
        measured, utilization, peak = self.conn.execute(
            "SELECT coalesce(sum(measured_seconds), 0.0), coalesce(sum(utilization_seconds), 0.0), "
            "max(peak_memory_mb) FROM gpu_rollup WHERE job_id = ?", (job_id,)).fetchone()
        return float(measured), float(utilization), peak

    def last_allocation(self, job_id: str) -> Allocation | None:
        return cast("Allocation | None", self._first(
            "allocations", "WHERE allocations.job_id = ? ORDER BY allocations.attempt DESC LIMIT ? OFFSET ?",
            job_id, 1, 0))

    def cluster(self, cluster_id: str) -> Cluster | None:
        return cast("Cluster | None", self._first("clusters", "WHERE clusters.id = ?", cluster_id))

    def newest_cluster_up(self, job_id: str) -> Cluster | None:
        return cast("Cluster | None", self._first(
            "clusters", "WHERE clusters.job_id = ? AND clusters.up_at IS NOT NULL ORDER BY clusters.created_at DESC",
            job_id))

    def last_progress(self, job_id: str) -> Progress | None:
        return cast("Progress | None", self._first(
            "progress_reports", "WHERE progress_reports.job_id = ? ORDER BY progress_reports.at DESC, "
            "progress_reports.id DESC LIMIT ? OFFSET ?", job_id, 1, 0))

    def spans(self, job_id: str) -> list[Span]:
        rows = self.conn.execute("SELECT started_at, running_at, ended_at FROM allocations WHERE job_id = ?", (job_id,))
        return [(_utc(a), _utc(b) if b else None, _utc(c) if c else None) for a, b, c in rows]

    def last_prediction(self, job_id: str) -> Prediction | None:
        return cast("Prediction | None", self._first(
            "predictions", "WHERE predictions.job_id = ? ORDER BY predictions.made_at DESC, predictions.id DESC "
            "LIMIT ? OFFSET ?", job_id, 1, 0))

    def predictions(self, job_id: str) -> list[Prediction]:
        return cast("list[Prediction]", self._rows("predictions", "WHERE predictions.job_id = ?", job_id))

    def succeeded(self, name: str, team: str, limit: int) -> list[Job]:
        return cast("list[Job]", self._rows(
            "jobs", "WHERE jobs.name = ? AND jobs.team = ? AND jobs.state = ? ORDER BY jobs.finished_at DESC "
            "LIMIT ? OFFSET ?", name, team, "SUCCEEDED", limit, 0))

    def unattended(self) -> tuple[int, int]:
        """(active jobs, live clusters), or (0, 0) when a service leads the store: ``broker.cli.engine.unattended``."""
        if self.conn.execute("SELECT max(leader_lease.epoch) FROM leader_lease").fetchone()[0]:
            return 0, 0
        marks = ", ".join("?" * len(ACTIVE_STATES))
        jobs = self.conn.execute(f"SELECT count(*) FROM jobs WHERE jobs.state IN ({marks})", ACTIVE_STATES)
        marks = ", ".join("?" * len(LIVE_CLUSTER_STATES))
        clusters = self.conn.execute(f"SELECT count(*) FROM clusters WHERE clusters.state IN ({marks})",
                                     LIVE_CLUSTER_STATES)
        return int(jobs.fetchone()[0] or 0), int(clusters.fetchone()[0] or 0)
