"""The statements a page of job summaries is read with (``broker.status.page_source``): one per kind of
row for all the page's jobs, each built and compiled once per dialect."""

from __future__ import annotations

import functools
import json
from typing import Any, NamedTuple

from sqlalchemy import JSON, Select, String, any_, bindparam, func, select, text, union_all
from sqlalchemy import cast as sql_cast

from broker.status.summary import EARLIER_JOBS
from broker.store.gpu import GpuRollupRow
from broker.store.tables import AllocationRow, ClusterRow, JobRow, LedgerRow, PredictionRow, ProgressRow

BRANCHES = 256  # names and teams per statement reading their latest finished jobs


def _table(row: type[Any]) -> Any:
    """A mapped class's table columns. Statements of table columns alone run without the ORM's layer
    (its compile step and result rows), which cost a page as much as its own rows did."""
    return row.__table__.c


def _columns(row: type[Any], *names: str) -> tuple[Any, ...]:
    return tuple(_table(row)[name] for name in names)


# The columns of each kind of row a summary reads (``broker.status.summary``'s protocols), with what
# finds the row of a job (job id, row id, times).
ALLOCATION = _columns(AllocationRow, "job_id", "attempt", "cluster_id", "started_at", "running_at", "ended_at")
CLUSTER = _columns(ClusterRow, "id", "job_id", "created_at", "up_at", "cloud", "zone", "instance_type", "spot",
                   "price_per_node_hour", "num_nodes", "teardown_reason")
PROGRESS = _columns(ProgressRow, "id", "job_id", "step", "total")
PREDICTION = _columns(PredictionRow, "id", "job_id", "made_at", "finish_at", "low_at", "high_at", "source")
# A job's, for a list's page (``GET /v1/jobs``): what a summary reads and the list's cursor.
JOBS = _table(JobRow)
JOB = _columns(JobRow, "id", "name", "team", "state", "pipeline_id", "stage", "preemptions", "migrations", "zones",
               "work_lost_s", "work_s", "num_nodes", "attempt", "checkpoint", "deadline", "created_at", "finished_at",
               "wall_started_at", "wall_finished_at", "exit_code", "reason", "checkpoint_reason")


# One row per name and team: the ids of its latest finished jobs, latest first, as one array (a row per
# job cost more to fetch than the rest of the read).
LATEST_FINISHED_PG = text(
    "SELECT p.name, p.team, ARRAY(SELECT jobs.id FROM jobs "
    "WHERE jobs.name = p.name AND jobs.team = p.team AND jobs.state = 'SUCCEEDED' "
    f"ORDER BY jobs.finished_at DESC LIMIT {EARLIER_JOBS + 1}) "
    "FROM unnest(CAST(:names AS VARCHAR[]), CAST(:teams AS VARCHAR[])) AS p(name, team)")


@functools.cache
def latest_finished_by_branch(pairs: int) -> Select[str, str, str]:
    """The ids, names and teams of the ``EARLIER_JOBS + 1`` latest finished jobs of each of ``pairs`` names
    and teams (parameters ``name0``, ``team0``, ...), latest first: a branch per pair, each through the
    (name, team, finished_at) index."""
    latest = union_all(*(
        select(JobRow.id, JobRow.name, JobRow.team, JobRow.finished_at)
        .where(JobRow.name == bindparam(f"name{i}"), JobRow.team == bindparam(f"team{i}"),
               JobRow.state == "SUCCEEDED")
        .order_by(JobRow.finished_at.desc()).limit(EARLIER_JOBS + 1).subquery().select()
        for i in range(pairs))).subquery()
    return select(latest.c.id, latest.c.name, latest.c.team).order_by(latest.c.finished_at.desc())


def bucket(n: int) -> int:
    """``n`` rounded up to a power of two."""
    return 1 << max(n - 1, 0).bit_length()


class _Reads(NamedTuple):
    """A page's statements, built and compiled once per dialect; each takes the page's job ids as ``ids``."""

    costs: Select[*tuple[Any, ...]]
    gpu: Select[*tuple[Any, ...]]
    allocations: Select[*tuple[Any, ...]]
    clusters: Select[*tuple[Any, ...]]  # also ``wanted``: the clusters of the jobs' latest allocations
    progress: Select[*tuple[Any, ...]]
    prediction: Select[*tuple[Any, ...]]


def _among(column: Any, name: str, postgres: bool) -> Any:
    """``column`` is one of the list parameter ``name`` (``listed``): on PostgreSQL ``= ANY`` of one
    parameter, so that the statement's text is the same for every page (compiled and parsed once, then
    prepared by the driver), instead of a placeholder per id rendered anew for each page; elsewhere an
    expanding ``IN``. The parameter is the list as JSON text, not an array: the driver dumps an array
    element by element in Python, which cost more than the statement it was for."""
    if postgres:
        return column == any_(func.array(select(func.json_array_elements_text(
            sql_cast(bindparam(name, type_=String), JSON))).scalar_subquery()))
    return column.in_(bindparam(name, expanding=True))


def listed(values: list[str], postgres: bool) -> Any:
    """``values`` as the list parameter of ``_among``."""
    return json.dumps(values) if postgres else values


@functools.cache
def reads(postgres: bool) -> _Reads:

    def ids(column: Any) -> Any:
        return _among(column, "ids", postgres)

    def latest(row: type[Any], at: str, columns: tuple[Any, ...]) -> Select[*tuple[Any, ...]]:
        """Each job's rows with its latest ``at`` (``_newest_per_job`` keeps the latest id among them)."""
        t = _table(row)
        newest = (select(t.job_id, func.max(t[at]).label("at")).where(ids(t.job_id)).group_by(t.job_id)
                  .subquery())
        return select(*columns).join(newest, (newest.c.job_id == t.job_id) & (newest.c.at == t[at]))

    ledger, rollup, allocation, cluster = (_table(row) for row in (LedgerRow, GpuRollupRow, AllocationRow,
                                                                    ClusterRow))
    return _Reads(
        costs=select(ledger.job_id, func.coalesce(func.sum(ledger.cost), 0.0),
                     func.coalesce(func.sum(ledger.on_demand_cost), 0.0))
        .where(ids(ledger.job_id)).group_by(ledger.job_id),
        gpu=select(rollup.job_id, func.coalesce(func.sum(rollup.measured_seconds), 0.0),
                   func.coalesce(func.sum(rollup.utilization_seconds), 0.0),
                   func.max(rollup.peak_memory_mb))
        .where(ids(rollup.job_id)).group_by(rollup.job_id),
        allocations=select(*ALLOCATION).where(ids(allocation.job_id)),
        clusters=select(*CLUSTER).where(_among(cluster.id, "wanted", postgres)
                                        | (ids(cluster.job_id) & cluster.up_at.is_not(None))),
        progress=latest(ProgressRow, "at", PROGRESS),
        prediction=latest(PredictionRow, "made_at", PREDICTION),
    )
