"""Build a report from the ledger for a window: spend, savings and waste by job, team, cloud, region, GPU.

The database does the grouping (``broker/reports/sums.py``): whole hours from the hourly roll-up,
the part-hours at the window's ends from the minutes, summed per team, cloud, region, GPU type,
usage and day, and per job only when the report's job grouping is asked for. What comes back to
Python is a few rows per group, so a month of 10,000 jobs costs what its groups do.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import asdict
from datetime import UTC, datetime, time, timedelta
from typing import Any

from sqlalchemy import ColumnElement, select

from broker.model import Usage
from broker.reports import sums
from broker.reports.model import DIMENSIONS, HELD_IDLE, HELD_IDLE_PARTS, IDLE_KEY, DailyPoint, Figures, Group, Report
from broker.reports.rightsizing import right_sizing
from broker.reports.sums import NO_TEAM, Cell, JobCell
from broker.reports.waste import ClusterFacts, JobFacts, top_wastes
from broker.reports.window import ReportError, Window, parse_window
from broker.store import Store
from broker.store.tables import ClusterRow, JobRow

__all__ = ["NO_TEAM", "ReportError", "Window", "build_report", "parse_window", "period_start"]


def build_report(store: Store, window: Window, team: str | None = None, now: datetime | None = None,
                 dimensions: tuple[str, ...] = DIMENSIONS) -> Report:
    """The report over ledger minutes in ``[window.start, window.end)``, optionally for one team.

    ``dimensions`` names the groupings to build (the dashboard leaves out the per-job one, the
    largest); every other figure is the same whichever are asked for.
    """
    unknown = set(dimensions) - set(DIMENSIONS)
    if unknown:
        raise ValueError(f"unknown report groupings: {sorted(unknown)}")
    with store.transaction() as session:
        sums.settle(session, store.dialect)
        rows = sums.window_rows(store.dialect, window, team)
        cells = sums.cells(session, rows)
        counters = sums.job_counters(session, rows)
        per_job = sums.job_cells(session, rows) if "job" in dimensions else []
        provisioning = sums.provisioning_by_zone(session, rows)
        idle = sums.idle_sums(session, rows)
        cluster_minutes = sums.cluster_gpu_minutes(session, rows) if idle else {}
        clusters = _cluster_facts(session, {i.cluster_id for i in idle})
        measured = sums.measured_gpu_hours(session, store.dialect, window, team)
        sizing = [asdict(r) for r in right_sizing(session, per_job, cells)] if per_job else []
        jobs = _job_facts(session, {c.job_id for c in per_job if c.job_id} | {i.job_id for i in idle if i.job_id})
    totals = Figures()
    groups: dict[str, dict[str, Figures]] = {d: defaultdict(Figures) for d in dimensions}
    shown = [d for d in dimensions if d != "job"]
    for cell in cells:
        _add([totals, *(groups[d][cell.key(d)] for d in shown)], cell)
    for count in counters:
        for figures in (totals, *(groups[d][count.key(d)] for d in shown)):
            figures.jobs += count.jobs
            figures.preemptions += count.preemptions
            figures.migrations += count.migrations
            figures.work_lost_s += count.work_lost_s
    totals.measured_gpu_hours = measured
    if "job" in dimensions:
        _add_jobs(groups["job"], per_job, jobs)
    return Report(
        start=window.start,
        end=window.end,
        team=team,
        generated_at=now or datetime.now(UTC),
        totals=totals,
        groups={d: _sorted_groups(d, rows_, jobs) for d, rows_ in groups.items()},
        wastes=top_wastes(provisioning, idle, cluster_minutes, clusters, jobs),
        daily=_daily(cells),
        right_sizing=sizing,
    )


_RUNNING = Usage.RUNNING.value


def _add(targets: list[Figures], cell: Cell | JobCell) -> None:
    """Add one grouped row to the totals and to its group in every grouping."""
    gpu_hours, cost, usage = cell.gpu_minutes / 60.0, cell.cost, cell.usage
    for figures in targets:
        figures.spend += cost
        figures.on_demand += cell.on_demand
        figures.gpu_hours += gpu_hours
        figures.shared_gpu_hours += cell.shared_gpu_minutes / 60.0
        if cell.spot:
            figures.spot_gpu_hours += gpu_hours
        if usage == _RUNNING:
            figures.useful_gpu_hours += gpu_hours
        elif usage in HELD_IDLE_PARTS:
            part = HELD_IDLE_PARTS[usage]
            figures.idle_gpu_hours[HELD_IDLE] = figures.idle_gpu_hours.get(HELD_IDLE, 0.0) + gpu_hours
            figures.idle_cost[HELD_IDLE] = figures.idle_cost.get(HELD_IDLE, 0.0) + cost
            figures.held_idle_parts[part] = figures.held_idle_parts.get(part, 0.0) + gpu_hours
            figures.held_idle_parts_cost[part] = figures.held_idle_parts_cost.get(part, 0.0) + cost
        else:
            figures.idle_gpu_hours[usage] = figures.idle_gpu_hours.get(usage, 0.0) + gpu_hours
            figures.idle_cost[usage] = figures.idle_cost.get(usage, 0.0) + cost


def _add_jobs(groups: dict[str, Figures], per_job: list[JobCell], jobs: dict[str, JobFacts]) -> None:
    """The job grouping: each job's minutes, and its lifetime counters once (idle GPUs under one key)."""
    for cell in per_job:
        _add([groups[cell.job_id or IDLE_KEY]], cell)
    for job_id in {c.job_id for c in per_job if c.job_id}:
        figures, job = groups[job_id], jobs.get(job_id)
        figures.jobs = 1
        if job is not None:
            figures.preemptions, figures.migrations, figures.work_lost_s = \
                job.preemptions, job.migrations, job.work_lost_s


def _sorted_groups(dimension: str, rows: dict[str, Figures], jobs: dict[str, JobFacts]) -> list[Group]:
    def label(key: str) -> str:
        if dimension == "job" and key == IDLE_KEY:
            return "(idle GPUs, no job)"
        job = jobs.get(key) if dimension == "job" else None
        return f"{job.name} ({job.team})" if job else key

    return [Group(key, label(key), figures)
            for key, figures in sorted(rows.items(), key=lambda kv: (-kv[1].spend, kv[0]))]


def _daily(cells: list[Cell]) -> list[DailyPoint]:
    totals: dict[tuple[str, str], list[float]] = defaultdict(lambda: [0.0, 0.0])
    for cell in cells:
        pair = totals[(cell.day, cell.cloud)]
        pair[0] += cell.cost
        pair[1] += cell.on_demand
    return [DailyPoint(day, cloud, s, od) for (day, cloud), (s, od) in sorted(totals.items())]


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
