"""The ledger rolled up by UTC hour, kept equal to the ledger by the database itself.

A report over a week of a large fleet would otherwise sum millions of ledger minutes. The roll-up
holds one row per cluster, hour and everything a report groups by (holder, job, team, usage,
cloud, region, zone, instance type, accelerator, spot), with the rows' count and sums. Time is
the sum of the rows' seconds, not their count: a minute splits into pieces (rows) where the
holders of a cluster's GPUs change.

Triggers on ``ledger`` keep it: every insert adds to its hour's row, every delete (metering's
take-back of minutes after a cluster's end) and update subtracts and adds, in the same
transaction as the change, whoever writes the ledger (the metering, a test, a bulk import). On
PostgreSQL they are statement triggers over the changed rows (a bulk insert costs one grouped
upsert); on SQLite, row triggers. Columns a ledger row may leave NULL hold '' here, so the
unique key can take the upsert.
"""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import Boolean, Float, Index, Integer, String, UniqueConstraint
from sqlalchemy.orm import Mapped, mapped_column

from broker.store.tables import Base, UtcDateTime

# The grouping columns, in the unique key's order (cluster first: a take-back deletes by cluster).
KEYS = ("cluster_id", "hour", "holder", "job_id", "team", "usage", "cloud", "region", "zone", "instance_type",
        "accelerator", "spot")
_NULLABLE = ("job_id", "team", "accelerator")


class LedgerRollupRow(Base):
    """The ledger's rows of one cluster, hour and grouping: their count and sums."""

    __tablename__ = "ledger_rollup"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    cluster_id: Mapped[str] = mapped_column(String(64))
    hour: Mapped[datetime] = mapped_column(UtcDateTime)  # UTC, the start of the hour
    holder: Mapped[str] = mapped_column(String(64))
    job_id: Mapped[str] = mapped_column(String(32), index=True)  # '' for idle GPUs
    team: Mapped[str] = mapped_column(String(100))  # '' where the ledger row has none
    usage: Mapped[str] = mapped_column(String(20))
    cloud: Mapped[str] = mapped_column(String(20))
    region: Mapped[str] = mapped_column(String(64))
    zone: Mapped[str] = mapped_column(String(64))
    instance_type: Mapped[str] = mapped_column(String(64))
    accelerator: Mapped[str] = mapped_column(String(50))  # '' where the ledger row has none
    spot: Mapped[bool] = mapped_column(Boolean)
    pieces: Mapped[int] = mapped_column(Integer)  # ledger rows summed here (a minute may be several)
    seconds: Mapped[float] = mapped_column(Float, server_default="0")  # sum of their seconds billed
    gpu_minutes: Mapped[float] = mapped_column(Float)  # sum of gpus * seconds / 60
    cost: Mapped[float] = mapped_column(Float)
    on_demand_cost: Mapped[float] = mapped_column(Float)

    __table_args__ = (
        UniqueConstraint(*KEYS, name="uq_ledger_rollup_key"),
        Index("ix_ledger_rollup_hour", "hour"),
    )


def _value(column: str, row: str) -> str:
    return f"coalesce({row}.{column}, '')" if column in _NULLABLE else f"{row}.{column}"


def _sums(legacy: bool) -> list[tuple[str, str]]:
    """The summed columns, each with the ledger-row expression it sums ('{r}' before each ledger column).

    ``legacy``: those of migration 0010, whose count was named ``minutes`` and which had no seconds.
    """
    sums = [("minutes" if legacy else "pieces", "1"), ("seconds", "{r}seconds"),
            ("gpu_minutes", "{r}gpus * {r}seconds / 60.0"), ("cost", "{r}cost"),
            ("on_demand_cost", "{r}on_demand_cost")]
    return [s for s in sums if not (legacy and s[0] == "seconds")]


def _sqlite_hour(row: str) -> str:
    # SQLite keeps UTC datetimes as 'YYYY-MM-DD HH:MM:SS.ffffff' text; the hour keeps that form.
    return f"substr({row}.minute, 1, 13) || ':00:00.000000'"


def _match(row: str, hour: str) -> str:
    return " AND ".join(f"ledger_rollup.{k} = {hour if k == 'hour' else _value(k, row)}" for k in KEYS)


def _sqlite_add(row: str, legacy: bool) -> str:
    sums = _sums(legacy)
    values = ", ".join([_sqlite_hour(row) if k == "hour" else _value(k, row) for k in KEYS]
                       + [e.format(r=f"{row}.") for _, e in sums])
    return (f"INSERT INTO ledger_rollup ({', '.join(KEYS)}, {', '.join(n for n, _ in sums)}) VALUES ({values}) "
            f"ON CONFLICT ({', '.join(KEYS)}) DO UPDATE SET "
            + ", ".join(f"{n} = {n} + excluded.{n}" for n, _ in sums) + ";")


def _sqlite_remove(row: str, legacy: bool) -> str:
    sums = _sums(legacy)
    match = _match(row, _sqlite_hour(row))
    return ("UPDATE ledger_rollup SET " + ", ".join(f"{n} = {n} - ({e.format(r=f'{row}.')})" for n, e in sums)
            + f" WHERE {match}; DELETE FROM ledger_rollup WHERE {match} AND {sums[0][0]} <= 0;")


def _postgres_grouped(table: str, legacy: bool) -> str:
    hour = "date_trunc('hour', minute AT TIME ZONE 'UTC') AT TIME ZONE 'UTC'"
    columns = ", ".join(f"{hour} AS hour" if k == "hour" else (f"coalesce({k}, '') AS {k}" if k in _NULLABLE else k)
                        for k in KEYS)
    sums = ", ".join(f"sum({e.format(r='')}) AS {n}" for n, e in _sums(legacy))
    return f"SELECT {columns}, {sums} FROM {table} GROUP BY {', '.join(str(i + 1) for i in range(len(KEYS)))}"


def _postgres_add(table: str, legacy: bool) -> str:
    sums = _sums(legacy)
    return (f"INSERT INTO ledger_rollup AS r ({', '.join(KEYS)}, {', '.join(n for n, _ in sums)}) "
            f"{_postgres_grouped(table, legacy)} ON CONFLICT ({', '.join(KEYS)}) DO UPDATE SET "
            + ", ".join(f"{n} = r.{n} + excluded.{n}" for n, _ in sums) + ";")


def _postgres_remove(table: str, legacy: bool) -> str:
    sums = _sums(legacy)
    match = " AND ".join(f"r.{k} = d.{k}" for k in KEYS)
    return ("UPDATE ledger_rollup AS r SET " + ", ".join(f"{n} = r.{n} - d.{n}" for n, _ in sums)
            + f" FROM ({_postgres_grouped(table, legacy)}) AS d WHERE {match}; DELETE FROM ledger_rollup "
            f"WHERE {sums[0][0]} <= 0 AND cluster_id IN (SELECT DISTINCT cluster_id FROM {table});")


def _postgres_function(name: str, body: str) -> str:
    return (f"CREATE OR REPLACE FUNCTION {name}() RETURNS trigger LANGUAGE plpgsql AS $$ "
            f"BEGIN {body} RETURN NULL; END $$;")


def install_sql(dialect: str, legacy: bool = False, fill: bool = True) -> list[str]:
    """The statements that create the triggers and (``fill``) fill the roll-up from the ledger as it stands.

    ``legacy``: migration 0010's roll-up (a row count named ``minutes``, no seconds), for it and its undoing.
    """
    grouped = _postgres_grouped("ledger", legacy)
    if dialect != "postgresql":
        grouped = grouped.replace("date_trunc('hour', minute AT TIME ZONE 'UTC') AT TIME ZONE 'UTC' AS hour",
                                  "substr(minute, 1, 13) || ':00:00.000000' AS hour")
    filling = [f"INSERT INTO ledger_rollup ({', '.join(KEYS)}, {', '.join(n for n, _ in _sums(legacy))}) {grouped}"]
    if dialect == "postgresql":
        return filling * fill + [
            _postgres_function("ledger_rollup_add", _postgres_add("added", legacy)),
            _postgres_function("ledger_rollup_remove", _postgres_remove("removed", legacy)),
            _postgres_function("ledger_rollup_change",
                               _postgres_remove("removed", legacy) + " " + _postgres_add("added", legacy)),
            _postgres_function("ledger_rollup_clear", "DELETE FROM ledger_rollup;"),
            "CREATE TRIGGER ledger_rollup_insert AFTER INSERT ON ledger REFERENCING NEW TABLE AS added "
            "FOR EACH STATEMENT EXECUTE FUNCTION ledger_rollup_add();",
            "CREATE TRIGGER ledger_rollup_delete AFTER DELETE ON ledger REFERENCING OLD TABLE AS removed "
            "FOR EACH STATEMENT EXECUTE FUNCTION ledger_rollup_remove();",
            "CREATE TRIGGER ledger_rollup_update AFTER UPDATE ON ledger REFERENCING OLD TABLE AS removed "
            "NEW TABLE AS added FOR EACH STATEMENT EXECUTE FUNCTION ledger_rollup_change();",
            "CREATE TRIGGER ledger_rollup_truncate AFTER TRUNCATE ON ledger "
            "FOR EACH STATEMENT EXECUTE FUNCTION ledger_rollup_clear();",
        ]
    return filling * fill + [
        f"CREATE TRIGGER ledger_rollup_insert AFTER INSERT ON ledger BEGIN {_sqlite_add('NEW', legacy)} END;",
        f"CREATE TRIGGER ledger_rollup_delete AFTER DELETE ON ledger BEGIN {_sqlite_remove('OLD', legacy)} END;",
        f"CREATE TRIGGER ledger_rollup_update AFTER UPDATE ON ledger BEGIN {_sqlite_remove('OLD', legacy)} "
        f"{_sqlite_add('NEW', legacy)} END;",
    ]


def uninstall_sql(dialect: str) -> list[str]:
    triggers = [f"DROP TRIGGER IF EXISTS ledger_rollup_{op}" + (" ON ledger" if dialect == "postgresql" else "")
                for op in ("insert", "delete", "update", "truncate")]
    if dialect != "postgresql":
        return triggers[:3]
    return triggers + [f"DROP FUNCTION IF EXISTS ledger_rollup_{f}()" for f in ("add", "remove", "change", "clear")]
