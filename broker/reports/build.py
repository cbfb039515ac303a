"""Build a report from the ledger for a window: spend, savings and waste by job, team, cloud, region, GPU.

The ledger is summed in the database (one row per cluster, holder, usage and day), so a week of
minutes for a large fleet comes back as a few thousand rows; everything after that is plain Python.
Whole hours are read from the hourly roll-up (``broker/store/rollup.py``), so a month costs what
its clusters' hours do, not its minutes; the part-hours at the window's ends from the minutes.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from datetime import UTC, datetime, time, timedelta
from typing import Any

from sqlalchemy import ColumnElement, func, select

from broker.model import Usage
from broker.reports.facts import IDLE_KEY, Fact
from broker.reports.model import DIMENSIONS, DailyPoint, Figures, Group, Report
from broker.reports.waste import ClusterFacts, JobFacts, top_wastes
from broker.reports.window import ReportError, Window, parse_window
from broker.store import Store
from broker.store.rollup import LedgerRollupRow
from broker.store.tables import ClusterRow, JobRow, LedgerRow

__all__ = ["NO_TEAM", "ReportError", "Window", "build_report", "parse_window", "period_start"]

NO_TEAM = "(none)"


def build_report(store: Store, window: Window, team: str | None = None,
                 now: datetime | None = None) -> Report:
    """The report over ledger minutes in ``[window.start, window.end)``, optionally for one team."""
    with store.transaction() as session:
        sums = _ledger_sums(session, store.dialect, window)
        clusters = _cluster_facts(session, {key[0] for key in sums})
        facts = [f for f in _ledger_facts(sums, clusters) if team is None or f.team == team]
        jobs = _job_facts(session, {f.job_id for f in facts if f.job_id})
    totals = Figures()
    groups: dict[str, dict[str, Figures]] = {d: defaultdict(Figures) for d in DIMENSIONS}
    for fact in facts:
        _add([totals, *(groups[d][fact.key(d)] for d in DIMENSIONS)], fact)
    _add_job_counters(totals, groups, facts, jobs)
    _add_shared(totals, groups, facts, jobs)
    return Report(
        start=window.start,
        end=window.end,
        team=team,
        generated_at=now or datetime.now(UTC),
        totals=totals,
        groups={d: _sorted_groups(d, rows, jobs) for d, rows in groups.items()},
        wastes=top_wastes(facts, clusters, jobs),
        daily=_daily(facts),
    )


_RUNNING = Usage.RUNNING.value


def _add(targets: list[Figures], fact: Fact) -> None:
    """Add one fact to the totals and to its group in every grouping (the report's inner loop)."""
    gpu_hours, cost, usage = fact.gpu_minutes / 60.0, fact.cost, fact.usage
    for figures in targets:
        figures.spend += cost
        figures.on_demand += fact.on_demand
        figures.gpu_hours += gpu_hours
        if fact.spot:
            figures.spot_gpu_hours += gpu_hours
        if usage == _RUNNING:
            figures.useful_gpu_hours += gpu_hours
        else:
            figures.idle_gpu_hours[usage] = figures.idle_gpu_hours.get(usage, 0.0) + gpu_hours
            figures.idle_cost[usage] = figures.idle_cost.get(usage, 0.0) + cost


def _add_job_counters(totals: Figures, groups: dict[str, dict[str, Figures]], facts: list[Fact],
                      jobs: dict[str, JobFacts]) -> None:
    """Preemptions, migrations and work lost are the lifetime counters of the jobs seen in the window.

    A job counts once in every grouping: under its own team, and under the cloud, region and GPU
    where it used the most GPU-hours in the window, so each grouping sums to the totals.
    """
    by_job: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    places: dict[str, Fact] = {}
    for fact in facts:
        if fact.job_id:
            by_job[fact.job_id][fact.cluster_id] += fact.gpu_minutes
            places.setdefault(f"{fact.job_id}:{fact.cluster_id}", fact)
    for job_id, per_cluster in by_job.items():
        job = jobs.get(job_id)
        dominant = places[f"{job_id}:{max(per_cluster, key=lambda c: per_cluster[c])}"]
        targets = [totals] + [groups[d][dominant.key(d)] for d in DIMENSIONS]
        for figures in targets:
            figures.jobs += 1
            if job is not None:
                figures.preemptions += job.preemptions
                figures.migrations += job.migrations
                figures.work_lost_s += job.work_lost_s


def _add_shared(totals: Figures, groups: dict[str, dict[str, Figures]], facts: list[Fact],
                jobs: dict[str, JobFacts]) -> None:
    """GPU-hours that jobs holding a fraction of a GPU ran on (beside them, the stranded idle cause)."""
    for fact in facts:
        job = jobs.get(fact.job_id) if fact.job_id and fact.usage == Usage.RUNNING.value else None
        if job is not None and job.gpu_share is not None:
            for figures in (totals, *(groups[d][fact.key(d)] for d in DIMENSIONS)):
                figures.shared_gpu_hours += fact.gpu_hours


def _sorted_groups(dimension: str, rows: dict[str, Figures], jobs: dict[str, JobFacts]) -> list[Group]:
    def label(key: str) -> str:
        if dimension == "job" and key == IDLE_KEY:
            return "(idle GPUs, no job)"
        job = jobs.get(key) if dimension == "job" else None
        return f"{job.name} ({job.team})" if job else key

    return [Group(key, label(key), figures) for key, figures in sorted(rows.items(), key=lambda kv: -kv[1].spend)]


def _daily(facts: Iterable[Fact]) -> list[DailyPoint]:
    sums: dict[tuple[str, str], list[float]] = defaultdict(lambda: [0.0, 0.0])
    for fact in facts:
        pair = sums[(fact.day, fact.cloud)]
        pair[0] += fact.cost
        pair[1] += fact.on_demand
    return [DailyPoint(day, cloud, s, od) for (day, cloud), (s, od) in sorted(sums.items())]


_Key = tuple[Any, ...]  # cluster, holder, job, team, usage, cloud, region, zone, accelerator, instance type, spot, day


def _whole_hours(window: Window) -> tuple[datetime, datetime]:
    """The whole UTC hours inside the window: read from the roll-up; the minutes either side from the ledger."""
    first = window.start.astimezone(UTC).replace(minute=0, second=0, microsecond=0)
    if first < window.start:
        first += timedelta(hours=1)
    last = window.end.astimezone(UTC).replace(minute=0, second=0, microsecond=0)
    return first, max(first, last)


def _day(dialect: str, column: Any) -> ColumnElement[Any]:
    if dialect == "postgresql":
        return func.to_char(func.timezone("UTC", column), "YYYY-MM-DD")
    return func.substr(column, 1, 10)  # SQLite stores UTC as 'YYYY-MM-DD HH:MM:SS'


def _ledger_sums(session: Any, dialect: str, window: Window) -> dict[_Key, list[float]]:
    """Gpu-minutes, cost, on-demand cost and minutes per key and UTC day, for ledger minutes in the window.

    Whole hours come from the hourly roll-up (kept equal to the ledger by the database); only the
    partial hours at the window's ends are summed from the ledger's minutes.
    """
    sums: dict[_Key, list[float]] = {}

    def add(rows: Any, blank_is_none: bool) -> None:
        for *key, gpu_minutes, cost, on_demand, minutes in rows:
            if blank_is_none:  # the roll-up keeps '' where the ledger has NULL
                key[2], key[3], key[8] = key[2] or None, key[3] or None, key[8] or None
            key[10] = bool(key[10])
            total = sums.setdefault(tuple(key), [0.0, 0.0, 0.0, 0])
            total[0] += float(gpu_minutes or 0.0)
            total[1] += float(cost or 0.0)
            total[2] += float(on_demand or 0.0)
            total[3] += int(minutes)

    first, last = _whole_hours(window)
    spans = [(window.start, first), (last, window.end)] if first < last else [(window.start, window.end)]
    for begin, end in spans:
        if begin >= end:
            continue
        L = LedgerRow
        keys = (L.cluster_id, L.holder, L.job_id, L.team, L.usage, L.cloud, L.region, L.zone, L.accelerator,
                L.instance_type, L.spot, _day(dialect, L.minute))
        add(session.execute(select(*keys, func.sum(L.gpus * L.seconds / 60.0), func.sum(L.cost),
                                   func.sum(L.on_demand_cost), func.count())
                            .where(L.minute >= begin, L.minute < end).group_by(*keys)), False)
    if first < last:
        R = LedgerRollupRow
        keys = (R.cluster_id, R.holder, R.job_id, R.team, R.usage, R.cloud, R.region, R.zone, R.accelerator,
                R.instance_type, R.spot, _day(dialect, R.hour))
        add(session.execute(select(*keys, func.sum(R.gpu_minutes), func.sum(R.cost), func.sum(R.on_demand_cost),
                                   func.sum(R.minutes))
                            .where(R.hour >= first, R.hour < last).group_by(*keys)), True)
    for total in sums.values():  # the order floats were added in (hours, minutes) shows below 1e-9 only
        total[0], total[1], total[2] = round(total[0], 9), round(total[1], 9), round(total[2], 9)
    return sums


def _ledger_facts(sums: dict[_Key, list[float]], clusters: dict[str, ClusterFacts]) -> list[Fact]:
    facts = []
    for (cluster_id, holder, job_id, team, usage, cloud, region, zone, accelerator, instance_type, spot, day_), \
            (gpu_minutes, cost, on_demand, minutes) in sums.items():
        owner = clusters.get(cluster_id)
        facts.append(Fact(
            cluster_id=cluster_id, holder=holder, job_id=job_id,
            team=team or (owner.team if owner and owner.team else NO_TEAM),
            usage=usage, cloud=cloud, region=region, zone=zone, gpu=accelerator or instance_type, spot=spot,
            day=str(day_), gpu_minutes=gpu_minutes, cost=cost, on_demand=on_demand, minutes=int(minutes),
        ))
    return facts


def _cluster_facts(session: Any, cluster_ids: set[str]) -> dict[str, ClusterFacts]:
    """The clusters with ledger minutes in the window, with their size and the team of the job that launched them."""
    found: dict[str, ClusterFacts] = {}
    for chunk in _id_chunks(session, ClusterRow.id, cluster_ids):
        stmt = (
            select(ClusterRow.id, ClusterRow.cloud, ClusterRow.zone, ClusterRow.accelerator, ClusterRow.instance_type,
                   ClusterRow.num_nodes, ClusterRow.gpus_per_node, JobRow.team)
            .outerjoin(JobRow, JobRow.id == ClusterRow.job_id)
            .where(chunk)
        )
        for cid, cloud, zone, acc, itype, nodes, gpn, team in session.execute(stmt):
            found[cid] = ClusterFacts(cid, cloud, zone, acc or itype, nodes * gpn, team)
    return found


def _id_chunks(session: Any, column: Any, ids: set[str]) -> list[ColumnElement[bool]]:
    """Conditions ``column`` among ``ids``: one array parameter on PostgreSQL, lists of 500 on SQLite."""
    ordered = sorted(ids)
    if session.get_bind().dialect.name == "postgresql":
        from sqlalchemy import String, any_, bindparam
        from sqlalchemy.dialects.postgresql import ARRAY

        return [column == any_(bindparam("ids", ordered, type_=ARRAY(String)))] if ordered else []
    return [column.in_(ordered[i:i + 500]) for i in range(0, len(ordered), 500)]


def _job_facts(session: Any, job_ids: set[str]) -> dict[str, JobFacts]:
    jobs: dict[str, JobFacts] = {}
    for chunk in _id_chunks(session, JobRow.id, job_ids):
        stmt = select(JobRow.id, JobRow.name, JobRow.team, JobRow.state, JobRow.preemptions, JobRow.migrations,
                      JobRow.work_lost_s, JobRow.zones, JobRow.gpu_share).where(chunk)
        for jid, name, team, state, preemptions, migrations, lost, zones, share in session.execute(stmt):
            jobs[jid] = JobFacts(jid, name, team, state, preemptions or 0, migrations or 0, float(lost or 0.0),
                                 tuple(zones or ()), share)
    return jobs


def period_start(now: datetime, period: str) -> datetime:
    """Start (UTC) of the budget period holding ``now``: the day, the ISO week (Monday) or the month."""
    day = datetime.combine(now.astimezone(UTC).date(), time(), tzinfo=UTC)
    if period == "day":
        return day
    if period == "week":
        return day - timedelta(days=day.weekday())
    return day.replace(day=1)
