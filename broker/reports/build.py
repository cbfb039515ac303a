"""Build a report from the ledger for a window: spend, savings and waste by job, team, cloud, region, GPU.

The ledger is summed in the database (one row per cluster, holder, usage and day), so a week of
minutes for a large fleet comes back as a few thousand rows; everything after that is plain Python.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, date, datetime, time, timedelta
from typing import Any

from sqlalchemy import ColumnElement, func, select

from broker.model import Usage
from broker.reports.facts import IDLE_KEY, Fact
from broker.reports.model import DIMENSIONS, DailyPoint, Figures, Group, Report
from broker.reports.waste import ClusterFacts, JobFacts, top_wastes
from broker.store import Store
from broker.store.tables import ClusterRow, JobRow, LedgerRow

NO_TEAM = "(none)"


class ReportError(ValueError):
    """Bad report input (window, team); the message names the option and what was expected."""


@dataclass(frozen=True, slots=True)
class Window:
    start: datetime
    end: datetime


def parse_window(since: str | None, start: str | None, end: str | None, now: datetime) -> Window:
    """``--since 7d`` back from ``--to`` (default now), or ``--from``/``--to`` as ISO dates or times (UTC)."""
    from broker.spec import SpecError, parse_duration

    if since and start:
        raise ReportError("give either --since or --from, not both")
    stop = _parse_time(end, "--to") if end else now
    if start:
        begin = _parse_time(start, "--from")
    else:
        try:
            begin = stop - parse_duration(since or "7d", "--since")
        except SpecError as exc:
            raise ReportError(str(exc).removeprefix("job file: ")) from exc
    if begin >= stop:
        raise ReportError(f"--from {begin:%Y-%m-%d %H:%M} must be before --to {stop:%Y-%m-%d %H:%M}")
    return Window(begin, stop)


def _parse_time(text: str, option: str) -> datetime:
    try:
        value = datetime.fromisoformat(text)
    except ValueError:
        try:
            value = datetime.combine(date.fromisoformat(text), time())
        except ValueError:
            raise ReportError(f"{option}: expected a date like 2026-01-05 or a time like 2026-01-05T08:00, "
                              f"got {text!r}") from None
    return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


def build_report(store: Store, window: Window, team: str | None = None,
                 now: datetime | None = None) -> Report:
    """The report over ledger minutes in ``[window.start, window.end)``, optionally for one team."""
    with store.transaction() as session:
        clusters = _cluster_facts(session, store.dialect, window)
        facts = [f for f in _ledger_facts(session, store.dialect, window, clusters) if team is None or f.team == team]
        jobs = _job_facts(session, {f.job_id for f in facts if f.job_id})
    totals = Figures()
    groups: dict[str, dict[str, Figures]] = {d: defaultdict(Figures) for d in DIMENSIONS}
    for fact in facts:
        _add(totals, fact)
        for dimension in DIMENSIONS:
            _add(groups[dimension][fact.key(dimension)], fact)
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


def _add(figures: Figures, fact: Fact) -> None:
    figures.spend += fact.cost
    figures.on_demand += fact.on_demand
    figures.gpu_hours += fact.gpu_hours
    if fact.spot:
        figures.spot_gpu_hours += fact.gpu_hours
    if fact.usage == Usage.RUNNING.value:
        figures.useful_gpu_hours += fact.gpu_hours
    else:
        figures.idle_gpu_hours[fact.usage] = figures.idle_gpu_hours.get(fact.usage, 0.0) + fact.gpu_hours
        figures.idle_cost[fact.usage] = figures.idle_cost.get(fact.usage, 0.0) + fact.cost


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


def _day_expression(dialect: str) -> ColumnElement[Any]:
    if dialect == "postgresql":
        return func.to_char(func.timezone("UTC", LedgerRow.minute), "YYYY-MM-DD")
    return func.substr(LedgerRow.minute, 1, 10)  # SQLite stores UTC as 'YYYY-MM-DD HH:MM:SS'


def _ledger_facts(session: Any, dialect: str, window: Window, clusters: dict[str, ClusterFacts]) -> list[Fact]:
    day = _day_expression(dialect).label("day")
    keys = (LedgerRow.cluster_id, LedgerRow.holder, LedgerRow.job_id, LedgerRow.team, LedgerRow.usage,
            LedgerRow.cloud, LedgerRow.region, LedgerRow.zone, LedgerRow.accelerator, LedgerRow.instance_type,
            LedgerRow.spot, day)
    stmt = (
        select(*keys, func.sum(LedgerRow.gpus * LedgerRow.seconds / 60.0), func.sum(LedgerRow.cost),
               func.sum(LedgerRow.on_demand_cost),
               func.count())
        .where(LedgerRow.minute >= window.start, LedgerRow.minute < window.end)
        .group_by(*keys)
    )
    facts = []
    for (cluster_id, holder, job_id, team, usage, cloud, region, zone, accelerator, instance_type, spot, day_,
         gpu_minutes, cost, on_demand, minutes) in session.execute(stmt):
        owner = clusters.get(cluster_id)
        facts.append(Fact(
            cluster_id=cluster_id, holder=holder, job_id=job_id,
            team=team or (owner.team if owner and owner.team else NO_TEAM),
            usage=usage, cloud=cloud, region=region, zone=zone, gpu=accelerator or instance_type, spot=bool(spot),
            day=str(day_), gpu_minutes=float(gpu_minutes or 0.0), cost=float(cost or 0.0),
            on_demand=float(on_demand or 0.0), minutes=int(minutes),
        ))
    return facts


def _cluster_facts(session: Any, dialect: str, window: Window) -> dict[str, ClusterFacts]:
    """Clusters with ledger minutes in the window, with their size and the team of the job that launched them."""
    in_window = (select(LedgerRow.cluster_id)
                 .where(LedgerRow.minute >= window.start, LedgerRow.minute < window.end).distinct())
    stmt = (
        select(ClusterRow.id, ClusterRow.cloud, ClusterRow.zone, ClusterRow.accelerator, ClusterRow.instance_type,
               ClusterRow.num_nodes, ClusterRow.gpus_per_node, JobRow.team)
        .outerjoin(JobRow, JobRow.id == ClusterRow.job_id)
        .where(ClusterRow.id.in_(in_window))
    )
    return {
        cid: ClusterFacts(cid, cloud, zone, acc or itype, nodes * gpn, team)
        for cid, cloud, zone, acc, itype, nodes, gpn, team in session.execute(stmt)
    }


def _job_facts(session: Any, job_ids: set[str]) -> dict[str, JobFacts]:
    jobs: dict[str, JobFacts] = {}
    ids = sorted(job_ids)
    for chunk in (ids[i:i + 500] for i in range(0, len(ids), 500)):
        stmt = select(JobRow.id, JobRow.name, JobRow.team, JobRow.state, JobRow.preemptions, JobRow.migrations,
                      JobRow.work_lost_s, JobRow.zones, JobRow.gpu_share).where(JobRow.id.in_(chunk))
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
