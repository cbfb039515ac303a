"""The teams page's chart: GPUs each team held over time, against the share it was owed then.

Sampled every ``STEP`` over the last ``SPAN`` (or since the first allocation, if later): a team
holds at an instant the GPUs of its allocations running then (whole GPUs, or their share of one);
it is owed what the fair-share division (``policies.fair_share.owed_shares``) gives it among the
teams that held GPUs or had a job waiting for its first start then. Waits after a requeue are not
counted as demand: the store keeps a job's first start, not each return to the queue. One solid line
per team for what it held, a dashed one in the same colour for what it was owed.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from datetime import datetime, timedelta

from sqlalchemy import or_, select
from sqlalchemy.orm import Session

from broker.config.teams import FairShareConfig
from broker.store.tables import AllocationRow, JobRow
from broker.web.html import e
from policies.fair_share import FairShareRequest, QueuedGang, TeamUsage, owed_shares

SPAN = timedelta(hours=24)
STEP = timedelta(minutes=15)
PALETTE = ("#2f6fdb", "#e67e22", "#27ae60", "#8e44ad", "#c0392b", "#16a085", "#d35400", "#7f8c8d")


@dataclass(frozen=True)
class TeamSeries:
    times: list[datetime]
    held: dict[str, list[float]]  # team -> GPUs held at each time
    owed: dict[str, list[float]]  # team -> GPUs owed at each time


def load_usage(s: Session, config: FairShareConfig, now: datetime) -> TeamSeries:
    since = now - SPAN
    allocations = s.execute(
        select(JobRow.team, AllocationRow.gpus, AllocationRow.gpu_share, AllocationRow.running_at,
               AllocationRow.started_at, AllocationRow.ended_at)
        .join(JobRow, JobRow.id == AllocationRow.job_id)
        .where(or_(AllocationRow.ended_at.is_(None), AllocationRow.ended_at >= since))).all()
    waiting = s.execute(
        select(JobRow.id, JobRow.team, JobRow.num_nodes, JobRow.gpus_per_node, JobRow.priority, JobRow.created_at,
               JobRow.started_at, JobRow.finished_at)
        .where(JobRow.created_at <= now, or_(JobRow.started_at.is_(None), JobRow.started_at >= since))).all()
    spans = [(team, sum(len(v) for v in (gpus or {}).values()) * (share or 1.0), running_at or started_at, ended_at)
             for team, gpus, share, running_at, started_at, ended_at in allocations]
    first = min((began for _, _, began, _ in spans), default=now)
    start = max(since, first)
    times = [start + STEP * i for i in range(int((now - start) / STEP) + 1)] or [now]
    held: dict[str, list[float]] = defaultdict(lambda: [0.0] * len(times))
    owed: dict[str, list[float]] = defaultdict(lambda: [0.0] * len(times))
    for i, at in enumerate(times):
        holding: dict[str, float] = defaultdict(float)
        for team, count, began, ended in spans:
            if began <= at and (ended is None or at < ended):
                holding[team] += count
        queued = tuple(QueuedGang(job_id, team, nodes * per_node, priority, order)
                       for order, (job_id, team, nodes, per_node, priority, created, started, finished)
                       in enumerate(waiting)
                       if nodes * per_node > 0 and created <= at and (started is None or at < started)
                       and (finished is None or at < finished))
        request = FairShareRequest(config.capacity_gpus, config.teams,
                                   tuple(TeamUsage(t, round(n)) for t, n in sorted(holding.items())), queued,
                                   half_life_s=config.half_life_s)
        for team, n in holding.items():
            held[team][i] = n
        for team, n in owed_shares(request).items():
            owed[team][i] = n
    return TeamSeries(times, dict(held), dict(owed))


def usage_svg(series: TeamSeries, teams: list[str]) -> str:
    """The chart for ``teams`` (those the viewer may see), or a line saying there is nothing to draw."""
    shown = [t for t in sorted(set(series.held) | set(series.owed)) if t in teams]
    if not shown or len(series.times) < 2:
        return '<p class="team-usage-empty">No GPUs held by a team in the last 24 hours.</p>'
    width, top, height, left = 760.0, 16.0, 160.0, 60.0
    start, end = series.times[0], series.times[-1]
    span = max((end - start).total_seconds(), 1.0)
    peak = max([1.0, *(max(series.held.get(t, [0.0]) + series.owed.get(t, [0.0])) for t in shown)])

    def x(at: datetime) -> float:
        return left + width * (at - start).total_seconds() / span

    def y(value: float) -> float:
        return top + height - height * value / peak

    parts = [f'<text x="4" y="{top + 10:.0f}" class="lane">GPUs</text>',
             f'<text x="{left - 6:.0f}" y="{top + 4:.0f}" text-anchor="end" class="lane">{peak:g}</text>',
             f'<line x1="{left:.0f}" x2="{left + width:.0f}" y1="{y(0):.1f}" y2="{y(0):.1f}" stroke="#ccc"/>',
             f'<text x="{left:.0f}" y="{y(0) + 14:.1f}" class="lane">{start:%Y-%m-%d %H:%M} UTC</text>',
             f'<text x="{left + width:.0f}" y="{y(0) + 14:.1f}" text-anchor="end" class="lane">'
             f'{end:%Y-%m-%d %H:%M} UTC</text>']
    legend = []
    for i, team in enumerate(shown):
        colour = PALETTE[i % len(PALETTE)]
        for kind, values, dash in (("held", series.held.get(team, []), ""),
                                   ("owed", series.owed.get(team, []), ' stroke-dasharray="5 3"')):
            if not values:
                continue
            points = " ".join(f"{x(at):.1f},{y(v):.1f}" for at, v in zip(series.times, values, strict=True))
            parts.append(f'<polyline class="team-{kind}" data-team="{e(team)}" points="{points}" fill="none" '
                         f'stroke="{colour}" stroke-width="1.5"{dash}><title>team {e(team)}: GPUs {kind}, '
                         f'latest {values[-1]:g}, peak {max(values):g}</title></polyline>')
        legend.append(f'<span class="legend-item" data-team="{e(team)}" style="color:{colour}">&#9632; '
                      f'{e(team)}</span>')
    bottom = y(0) + 20
    return (f'<svg class="team-usage" viewBox="0 0 {left + width + 20:.0f} {bottom:.0f}" width="100%" role="img" '
            f'aria-label="GPUs held per team over time against the share owed">{"".join(parts)}</svg>'
            f'<p class="legend">{" ".join(legend)} &mdash; solid: GPUs held; dashed: the share owed</p>')
