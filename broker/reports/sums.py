"""The report's sums, grouped in the database (SQLite and PostgreSQL alike).

Every query reads the same rows: the window's whole UTC hours from the hourly roll-up
(``broker/store/rollup.py``, kept equal to the ledger by the database) and the part-hours at its
ends from the ledger's minutes, with each row's team resolved (its own, else the team of the job
its cluster was launched for) and the team filter applied. The queries then group those rows by
what the report shows, so what comes back is a few rows per team, cloud, region, GPU type, usage
and day, not one per job: a month of 10,000 jobs is summed by the database, not by Python.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import (
    ColumnElement,
    Date,
    Float,
    Subquery,
    and_,
    case,
    cast,
    func,
    or_,
    select,
    text,
    union_all,
)

from broker.model import Usage
from broker.reports.window import Window
from broker.store.gpu import GpuMinuteRow, GpuRollupRow
from broker.store.rollup import LedgerRollupRow
from broker.store.tables import ClusterRow, JobRow, LedgerRow

NO_TEAM = "(none)"
_RUNNING, _PROVISIONING = Usage.RUNNING.value, Usage.PROVISIONING.value


def _num(value: Any) -> float:
    # Rounded to 1e-9: the order the database adds floats in shows only below that.
    return round(float(value or 0.0), 9)


def group_key(dimension: str, team: str, cloud: str, region: str, gpu: str) -> str:
    """The key of a row in the team, cloud, region or GPU grouping."""
    if dimension == "team":
        return team
    if dimension == "cloud":
        return cloud
    if dimension == "region":
        return f"{cloud}/{region}"
    return gpu


@dataclass(frozen=True, slots=True)
class Cell:
    """The window's rows of one team, cloud, region, GPU type, usage, spot or not, and UTC day."""

    team: str
    cloud: str
    region: str
    gpu: str
    usage: str
    spot: bool
    day: str
    gpu_minutes: float
    cost: float
    on_demand: float
    shared_gpu_minutes: float  # running minutes of jobs holding a fraction of a GPU

    def key(self, dimension: str) -> str:
        return group_key(dimension, self.team, self.cloud, self.region, self.gpu)


@dataclass(frozen=True, slots=True)
class JobCell:
    """The window's rows of one job ('' for idle GPUs), usage and spot or not."""

    job_id: str
    usage: str
    spot: bool
    gpu_minutes: float
    cost: float
    on_demand: float
    shared_gpu_minutes: float


@dataclass(frozen=True, slots=True)
class JobCounters:
    """The jobs whose most GPU-minutes in the window were on this team, cloud, region and GPU type."""

    team: str
    cloud: str
    region: str
    gpu: str
    jobs: int
    preemptions: int
    migrations: int
    work_lost_s: float

    def key(self, dimension: str) -> str:
        return group_key(dimension, self.team, self.cloud, self.region, self.gpu)


@dataclass(frozen=True, slots=True)
class IdleSum:
    """Idle minutes (other than provisioning) of one cluster, job (None: no job) and cause."""

    cluster_id: str
    job_id: str | None
    usage: str
    gpu_minutes: float
    cost: float
    minutes: float  # the rows' seconds over 60 (a minute splits into rows where holders change)


@dataclass(frozen=True, slots=True)
class ZoneProvisioning:
    """The provisioning minutes of the clusters of one zone: how many, their minutes up, GPU-minutes and cost."""

    zone: str  # cloud/zone
    clusters: int
    minutes_up: float  # summed over the clusters: each one's provisioning GPU-minutes over its GPUs
    gpu_minutes: float
    cost: float


def _whole_hours(window: Window) -> tuple[datetime, datetime]:
    """The whole UTC hours inside the window: read from the roll-up; the minutes either side from the ledger."""
    first = window.start.astimezone(UTC).replace(minute=0, second=0, microsecond=0)
    if first < window.start:
        first += timedelta(hours=1)
    last = window.end.astimezone(UTC).replace(minute=0, second=0, microsecond=0)
    return first, max(first, last)


def day_of(dialect: str, column: Any) -> ColumnElement[Any]:
    """The UTC day of a time: a date on PostgreSQL (cheaper to group by than text), 'YYYY-MM-DD' on SQLite."""
    if dialect == "postgresql":
        return cast(func.timezone("UTC", column), Date)
    return func.substr(column, 1, 10)  # SQLite stores UTC as 'YYYY-MM-DD HH:MM:SS'


def _gpu(accelerator: Any, instance_type: Any) -> ColumnElement[Any]:
    return func.coalesce(func.nullif(accelerator, ""), instance_type)


def _rows(dialect: str, window: Window) -> Subquery:
    """The window's ledger minutes (at its ends) and roll-up hours (inside it), in one shape."""
    first, last = _whole_hours(window)
    L, R = LedgerRow, LedgerRollupRow
    if first < last:
        edges = or_(and_(L.minute >= window.start, L.minute < first), and_(L.minute >= last, L.minute < window.end))
    else:
        edges = and_(L.minute >= window.start, L.minute < window.end)
    minutes = select(
        L.cluster_id.label("cluster_id"), func.coalesce(L.job_id, "").label("job_id"),
        func.coalesce(L.team, "").label("team"), L.usage.label("usage"), L.cloud.label("cloud"),
        L.region.label("region"), L.zone.label("zone"), _gpu(L.accelerator, L.instance_type).label("gpu"),
        L.spot.label("spot"), day_of(dialect, L.minute).label("day"),
        (cast(L.gpus * L.seconds, Float) / 60.0).label("gpu_minutes"), L.cost.label("cost"),
        L.on_demand_cost.label("on_demand"), L.seconds.label("seconds"),
    ).where(edges)
    if first >= last:
        return minutes.subquery("u")
    hours = select(
        R.cluster_id, R.job_id, R.team, R.usage, R.cloud, R.region, R.zone, _gpu(R.accelerator, R.instance_type),
        R.spot, day_of(dialect, R.hour), R.gpu_minutes, R.cost, R.on_demand_cost, R.seconds,
    ).where(R.hour >= first, R.hour < last)
    return union_all(minutes, hours).subquery("u")


def window_rows(dialect: str, window: Window, team: str | None) -> Subquery:
    """The window's rows with the team resolved and filtered, and the GPU-minutes of fractional jobs marked."""
    u = _rows(dialect, window)
    # Looked up only for the rows without a team (idle GPUs), and fractional jobs are few: no join per row.
    owner_team = (select(JobRow.team).join(ClusterRow, ClusterRow.job_id == JobRow.id)
                  .where(ClusterRow.id == u.c.cluster_id).scalar_subquery())
    team_of = case((u.c.team != "", u.c.team), else_=func.coalesce(func.nullif(owner_team, ""), NO_TEAM))
    fractional = select(JobRow.id).where(JobRow.gpu_share.is_not(None))
    shared = case((and_(u.c.usage == _RUNNING, u.c.job_id.in_(fractional)), u.c.gpu_minutes), else_=0.0)
    stmt = select(u.c.cluster_id, u.c.job_id, team_of.label("team"), u.c.usage, u.c.cloud, u.c.region, u.c.zone,
                  u.c.gpu, u.c.spot, u.c.day, u.c.gpu_minutes, u.c.cost, u.c.on_demand, u.c.seconds,
                  shared.label("shared"))
    if team is not None:
        stmt = stmt.where(team_of == team)
    return stmt.subquery("r")


def settle(session: Any, dialect: str) -> None:
    """On PostgreSQL, for this transaction: group by hashing, in memory.

    The planner cannot tell that a month's rows fall into a few thousand groups, so by default it
    sorts them by their text keys under the database's collation (four times slower here), on
    disk past the default 4 MB of work memory, and JIT-compiles the plan (which alone cost more
    than the queries run).
    """
    if dialect == "postgresql":
        for setting in ("work_mem = '64MB'", "jit = off", "enable_sort = off"):
            session.execute(text(f"SET LOCAL {setting}"))


def cells(session: Any, r: Subquery) -> list[Cell]:
    keys = (r.c.team, r.c.cloud, r.c.region, r.c.gpu, r.c.usage, r.c.spot, r.c.day)
    stmt = select(*keys, func.sum(r.c.gpu_minutes), func.sum(r.c.cost), func.sum(r.c.on_demand),
                  func.sum(r.c.shared)).group_by(*keys)
    return [Cell(team, cloud, region, gpu, usage, bool(spot), str(day), _num(gm), _num(cost), _num(od), _num(sh))
            for team, cloud, region, gpu, usage, spot, day, gm, cost, od, sh in session.execute(stmt)]


def job_cells(session: Any, r: Subquery) -> list[JobCell]:
    keys = (r.c.job_id, r.c.usage, r.c.spot)
    stmt = select(*keys, func.sum(r.c.gpu_minutes), func.sum(r.c.cost), func.sum(r.c.on_demand),
                  func.sum(r.c.shared)).group_by(*keys)
    return [JobCell(job_id, usage, bool(spot), _num(gm), _num(cost), _num(od), _num(sh))
            for job_id, usage, spot, gm, cost, od, sh in session.execute(stmt)]


def job_counters(session: Any, r: Subquery) -> list[JobCounters]:
    """Each job of the window counted once, where it used the most GPU-minutes (ties: the first cluster by id).

    Its team is its own; its cloud, region and GPU type those of that cluster; so every grouping
    sums to the totals. Preemptions, migrations and work lost are the job's lifetime counters.
    """
    per = (select(r.c.job_id, r.c.cluster_id, func.min(r.c.team).label("team"), func.min(r.c.cloud).label("cloud"),
                  func.min(r.c.region).label("region"), func.min(r.c.gpu).label("gpu"),
                  func.sum(r.c.gpu_minutes).label("gm"))
           .where(r.c.job_id != "").group_by(r.c.job_id, r.c.cluster_id).subquery("per"))
    rank = func.row_number().over(partition_by=per.c.job_id, order_by=(per.c.gm.desc(), per.c.cluster_id))
    ranked = select(per, rank.label("rn")).subquery("ranked")
    keys = (ranked.c.team, ranked.c.cloud, ranked.c.region, ranked.c.gpu)
    stmt = (select(*keys, func.count(), func.sum(func.coalesce(JobRow.preemptions, 0)),
                   func.sum(func.coalesce(JobRow.migrations, 0)), func.sum(func.coalesce(JobRow.work_lost_s, 0.0)))
            .select_from(ranked.outerjoin(JobRow, JobRow.id == ranked.c.job_id))
            .where(ranked.c.rn == 1).group_by(*keys))
    return [JobCounters(team, cloud, region, gpu, int(n), int(pre or 0), int(mig or 0), float(lost or 0.0))
            for team, cloud, region, gpu, n, pre, mig, lost in session.execute(stmt)]


def provisioning_by_zone(session: Any, r: Subquery) -> list[ZoneProvisioning]:
    per = (select(r.c.cluster_id, func.min(r.c.cloud).label("cloud"), func.min(r.c.zone).label("zone"),
                  func.sum(r.c.gpu_minutes).label("gm"), func.sum(r.c.cost).label("cost"))
           .where(r.c.usage == _PROVISIONING).group_by(r.c.cluster_id).subquery("per"))
    size = ClusterRow.num_nodes * ClusterRow.gpus_per_node
    gpus = case((size > 0, size), else_=1)
    stmt = (select(per.c.cloud, per.c.zone, func.count(), func.sum(per.c.gm / gpus), func.sum(per.c.gm),
                   func.sum(per.c.cost))
            .select_from(per.outerjoin(ClusterRow, ClusterRow.id == per.c.cluster_id))
            .group_by(per.c.cloud, per.c.zone))
    return [ZoneProvisioning(f"{cloud}/{zone}", int(n), _num(up), _num(gm), _num(cost))
            for cloud, zone, n, up, gm, cost in session.execute(stmt)]


def idle_sums(session: Any, r: Subquery) -> list[IdleSum]:
    keys = (r.c.cluster_id, r.c.job_id, r.c.usage)
    stmt = (select(*keys, func.sum(r.c.gpu_minutes), func.sum(r.c.cost), func.sum(r.c.seconds))
            .where(r.c.usage.not_in((_RUNNING, _PROVISIONING))).group_by(*keys))
    return [IdleSum(cid, jid or None, usage, _num(gm), _num(cost), _num(seconds) / 60)
            for cid, jid, usage, gm, cost, seconds in session.execute(stmt)]


def cluster_gpu_minutes(session: Any, r: Subquery) -> dict[str, float]:
    """All GPU-minutes in the window of each cluster with idle minutes other than provisioning."""
    idle = func.sum(case((r.c.usage.not_in((_RUNNING, _PROVISIONING)), 1), else_=0))
    stmt = select(r.c.cluster_id, func.sum(r.c.gpu_minutes)).group_by(r.c.cluster_id).having(idle > 0)
    return {cid: _num(gm) for cid, gm in session.execute(stmt)}


def measured_gpu_hours(session: Any, dialect: str, window: Window, team: str | None) -> float:
    """GPU-hours of the window an agent measured the utilisation of: roll-up hours inside, minutes at the ends."""
    first, last = _whole_hours(window)
    M, R = GpuMinuteRow, GpuRollupRow
    measured = or_(M.utilization_mean.is_not(None), M.job_utilization_mean.is_not(None))
    if first < last:
        edges = or_(and_(M.started_at >= window.start, M.started_at < first),
                    and_(M.started_at >= last, M.started_at < window.end))
    else:
        edges = and_(M.started_at >= window.start, M.started_at < window.end)
    minutes = select(func.sum(M.seconds)).where(edges, measured)
    hours = select(func.sum(R.measured_seconds)).where(R.hour >= first, R.hour < last)
    if team is not None:
        minutes = minutes.join(JobRow, JobRow.id == M.job_id).where(JobRow.team == team)
        hours = hours.join(JobRow, JobRow.id == R.job_id).where(JobRow.team == team)
    seconds = float(session.scalar(minutes) or 0.0)
    if first < last:
        seconds += float(session.scalar(hours) or 0.0)
    return _num(seconds / 3600.0)
