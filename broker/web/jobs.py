"""Jobs: a sortable, filterable list of the viewer's jobs, and one job's page (timeline, ledger, logs)."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from sqlalchemy import func, select

from broker.errors import UserError
from broker.model import JobState
from broker.reports.rightsizing import job_suggestions
from broker.store import Store
from broker.store.rollup import LedgerRollupRow
from broker.store.tables import AllocationRow, ClusterRow, JobEventRow, JobRow, LedgerRow, NoticeRow
from broker.web.gpu_chart import gpu_svg, load_gpu
from broker.web.html import STATE_COLOURS, e, money, query, table
from broker.web.session import Viewer
from policies.rightsizing import Suggestion

SORTS = {"submitted": JobRow.created_at, "name": JobRow.name, "team": JobRow.team, "state": JobRow.state,
         "priority": JobRow.priority}
PAGE_SIZE = 200
LOG_TAIL_BYTES = 8192


class NotFound(UserError, LookupError):
    """No such job, or one the viewer may not see (the same answer for both)."""

    http_status = 404


@dataclass(frozen=True)
class JobFilter:
    state: str | None = None
    team: str | None = None
    q: str | None = None
    sort: str = "submitted"
    desc: bool = True

    @classmethod
    def parse(cls, state: str | None, team: str | None, q: str | None, sort: str | None,
              order: str | None) -> JobFilter:
        """Unknown values are a ValueError naming the field; text filters are bounded."""
        if state and state.upper() not in {s.value for s in JobState}:
            raise ValueError(f"state: expected one of {', '.join(s.value for s in JobState)}")
        for name, value in (("team", team), ("q", q)):
            if value is not None and (len(value) > 100 or "\x00" in value):
                raise ValueError(f"{name}: expected at most 100 characters of text")
        if sort and sort not in (*SORTS, "cost"):
            raise ValueError(f"sort: expected one of {', '.join((*SORTS, 'cost'))}")
        if order and order not in ("asc", "desc"):
            raise ValueError("order: expected asc or desc")
        return cls(state.upper() if state else None, team or None, q or None, sort or "submitted", order != "asc")


def progress_of(s: Any, job: JobRow, now: datetime,
                spans: list[tuple[datetime, datetime | None, datetime | None]] | None = None,
                ) -> tuple[float | None, datetime | None]:
    """Share of the job's work done and kept, and when it would finish at that pace (None when unknown).

    ``spans`` are the job's allocations as (started, running, ended), read here when not given.
    """
    if job.state == JobState.SUCCEEDED.value:
        return 1.0, None
    if not job.work_s:
        return None, None
    if spans is None:
        spans = [tuple(r) for r in s.execute(select(AllocationRow.started_at, AllocationRow.running_at,  # type: ignore[misc]
                                                    AllocationRow.ended_at).where(AllocationRow.job_id == job.id))]
    done = sum(max(((end or now) - (running or start)).total_seconds(), 0.0) for start, running, end in spans)
    done = min(max(done - job.work_lost_s, 0.0), job.work_s)
    finish = now + timedelta(seconds=job.work_s - done) if job.state == JobState.RUNNING.value else None
    return done / job.work_s, finish


def list_jobs(store: Store, viewer: Viewer, where: JobFilter) -> tuple[list[dict[str, Any]], int]:
    with store.transaction() as s:
        stmt = select(JobRow)
        if viewer.scope is not None:
            stmt = stmt.where(JobRow.team == viewer.scope)
        elif where.team:
            stmt = stmt.where(JobRow.team == where.team)
        if where.state:
            stmt = stmt.where(JobRow.state == where.state)
        if where.q:
            stmt = stmt.where(func.lower(JobRow.name).contains(where.q.lower(), autoescape=True)
                              | (JobRow.id == where.q))
        total = s.scalar(select(func.count()).select_from(stmt.subquery())) or 0
        if where.sort == "cost":
            # The hourly roll-up: the same sums as the ledger's minutes, a sixtieth of the rows or fewer.
            cost = (select(LedgerRollupRow.job_id, func.sum(LedgerRollupRow.cost).label("cost"))
                    .where(LedgerRollupRow.job_id != "").group_by(LedgerRollupRow.job_id).subquery())
            spent = func.coalesce(cost.c.cost, 0.0)
            stmt = stmt.outerjoin(cost, cost.c.job_id == JobRow.id).order_by(
                spent.desc() if where.desc else spent.asc(), JobRow.id)
        else:
            column = SORTS[where.sort]
            stmt = stmt.order_by(column.desc() if where.desc else column.asc(), JobRow.id)
        jobs = list(s.scalars(stmt.limit(PAGE_SIZE)))
        ids = [j.id for j in jobs]
        costs = dict(s.execute(select(LedgerRollupRow.job_id, func.sum(LedgerRollupRow.cost))
                               .where(LedgerRollupRow.job_id.in_(ids))
                               .group_by(LedgerRollupRow.job_id)).all()) if ids else {}
        places: dict[str, tuple[str, str]] = {}
        if ids:
            for job_id, cloud, zone in s.execute(
                    select(ClusterRow.job_id, ClusterRow.cloud, ClusterRow.zone)
                    .where(ClusterRow.job_id.in_(ids), ClusterRow.up_at.is_not(None))
                    .order_by(ClusterRow.created_at)):
                places[str(job_id)] = (cloud, zone)
        spans: dict[str, list[tuple[datetime, datetime | None, datetime | None]]] = {i: [] for i in ids}
        if ids:
            for job_id, started, running, ended in s.execute(
                    select(AllocationRow.job_id, AllocationRow.started_at, AllocationRow.running_at,
                           AllocationRow.ended_at).where(AllocationRow.job_id.in_(ids))):
                spans[job_id].append((started, running, ended))
        now = datetime.now(UTC)
        rows = []
        for job in jobs:
            share, _ = progress_of(s, job, now, spans[job.id])
            rows.append({"id": job.id, "name": job.name, "team": job.team, "state": job.state,
                         "priority": job.priority, "where": "/".join(places.get(job.id, ())) or "-",
                         "cost": float(costs.get(job.id) or 0.0), "progress": share,
                         "submitted": job.created_at})
    return rows, int(total)


def _state_badge(state: str) -> str:
    return f'<span class="state" style="background:{STATE_COLOURS.get(state, "#999")}">{e(state)}</span>'


def job_rows_html(rows: list[dict[str, Any]], where: JobFilter) -> str:
    params = query(state=where.state, team=where.team, q=where.q, sort=where.sort,
                   order="desc" if where.desc else "asc")
    body = []
    for r in rows:
        progress = "-" if r["progress"] is None else (
            f'<progress max="1" value="{r["progress"]:.3f}"></progress> {100 * r["progress"]:.0f}%')
        body.append(f'<tr data-job="{e(r["id"])}"><td><a href="/jobs/{e(r["id"])}">{e(r["id"])}</a></td>'
                    f'<td>{e(r["name"])}</td><td>{e(r["team"])}</td>'
                    f'<td class="job-state">{_state_badge(r["state"])}</td>'
                    f'<td>{r["priority"]}</td><td>{e(r["where"])}</td><td>{e(money(r["cost"]))}</td>'
                    f'<td>{progress}</td><td>{r["submitted"]:%Y-%m-%d %H:%M}</td></tr>')
    empty = '<tr><td colspan="9" class="empty">No jobs match.</td></tr>' if not rows else ""
    return (f'<tbody id="job-rows" hx-get="/jobs/rows{e(params)}" hx-trigger="every 2s" hx-swap="outerHTML">'
            f'{"".join(body)}{empty}</tbody>')


def render_list(rows: list[dict[str, Any]], total: int, where: JobFilter, viewer: Viewer) -> str:
    states = "".join(f'<option{" selected" if s.value == where.state else ""}>{s.value}</option>' for s in JobState)
    team = (f'<label>team <input name="team" value="{e(where.team or "")}"></label>' if viewer.admin else "")
    form = (f'<form class="filters" method="get" action="/jobs"><label>state <select name="state">'
            f'<option value="">any</option>{states}</select></label>{team}'
            f'<label>name or id <input name="q" value="{e(where.q or "")}"></label>'
            f'<input type="hidden" name="sort" value="{e(where.sort)}">'
            f'<input type="hidden" name="order" value="{"desc" if where.desc else "asc"}">'
            f'<button type="submit">Filter</button></form>')
    heads = []
    for label, key in (("job", None), ("name", "name"), ("team", "team"), ("state", "state"),
                       ("priority", "priority"), ("where", None), ("cost", "cost"), ("progress", None),
                       ("submitted", "submitted")):
        if key is None:
            heads.append(label)
            continue
        desc = not (where.sort == key and where.desc)
        arrow = (" ▼" if where.desc else " ▲") if where.sort == key else ""
        href = "/jobs" + query(state=where.state, team=where.team, q=where.q, sort=key, order="desc" if desc else "asc")
        heads.append(f'<a href="{e(href)}">{label}{arrow}</a>')
    head = "".join(f"<th>{h}</th>" for h in heads)
    shown = f"<p>{len(rows)} of {total} job(s){' (first ' + str(PAGE_SIZE) + ')' if total > PAGE_SIZE else ''}.</p>"
    return f'{form}{shown}<table class="jobs"><thead><tr>{head}</tr></thead>{job_rows_html(rows, where)}</table>'


# --- one job ---------------------------------------------------------------------------------------


@dataclass
class JobView:
    job: JobRow
    events: list[JobEventRow]
    allocations: list[tuple[AllocationRow, ClusterRow]]
    notices: list[tuple[NoticeRow, str]]
    prices: list[tuple[datetime, float]]  # (minute, USD per hour paid for the job's GPUs)
    ledger: list[tuple[str, str, str, float, float, float]]  # cluster, zone, usage, minutes billed, cost, on-demand
    progress: float | None
    finish: datetime | None
    gpu: dict[tuple[int, str, int], list[tuple[datetime, float]]] = field(default_factory=dict)
    checkpoints: list[datetime] = field(default_factory=list)
    sizing: tuple[Suggestion, ...] = ()


def load_job(store: Store, viewer: Viewer, job_id: str, now: datetime) -> JobView:
    if len(job_id) > 64 or "\x00" in job_id:
        raise NotFound(job_id)
    with store.transaction() as s:
        job = s.get(JobRow, job_id)
        if job is None or (viewer.scope is not None and job.team != viewer.scope):
            raise NotFound(job_id)
        events = list(s.scalars(select(JobEventRow).where(JobEventRow.job_id == job_id).order_by(JobEventRow.id)))
        allocations = [(a, c) for a, c in s.execute(
            select(AllocationRow, ClusterRow).join(ClusterRow, ClusterRow.id == AllocationRow.cluster_id)
            .where(AllocationRow.job_id == job_id).order_by(AllocationRow.attempt))]
        notices = [(n, zone) for n, zone in s.execute(
            select(NoticeRow, ClusterRow.zone).join(ClusterRow, ClusterRow.id == NoticeRow.cluster_id)
            .where(ClusterRow.job_id == job_id).order_by(NoticeRow.received_at))]
        prices = [(m, float(c) * 3600 / max(float(sec), 1.0)) for m, c, sec in s.execute(
            select(LedgerRow.minute, func.sum(LedgerRow.cost), func.max(LedgerRow.seconds))
            .where(LedgerRow.job_id == job_id).group_by(LedgerRow.minute).order_by(LedgerRow.minute))]
        # Minutes from the seconds billed, not rows: a minute where holders change is split into pieces.
        ledger = [(c, z, u, float(sec) / 60.0, float(cost), float(od)) for c, z, u, sec, cost, od in s.execute(
            select(LedgerRow.cluster_id, LedgerRow.zone, LedgerRow.usage, func.sum(LedgerRow.seconds),
                   func.sum(LedgerRow.cost),
                   func.sum(LedgerRow.on_demand_cost))
            .where(LedgerRow.job_id == job_id)
            .group_by(LedgerRow.cluster_id, LedgerRow.zone, LedgerRow.usage)
            .order_by(func.min(LedgerRow.minute)))]
        progress, finish = progress_of(s, job, now)
        gpu, checkpoints = load_gpu(s, job_id)
        sizing = job_suggestions(s, job)
        s.expunge_all()
    return JobView(job, events, allocations, notices, prices, ledger, progress, finish, gpu, checkpoints, sizing)


def log_tail(home: Path, job_id: str) -> str:
    directory = home / "logs" / job_id
    try:
        logs = sorted(directory.glob("attempt-*-node-*.log"), key=lambda p: p.stat().st_mtime)
    except OSError:
        return ""
    if not logs:
        return ""
    with logs[-1].open("rb") as handle:
        handle.seek(0, 2)
        handle.seek(max(handle.tell() - LOG_TAIL_BYTES, 0))
        text = handle.read().decode(errors="replace")
    return f"== {logs[-1].name} ==\n" + text


def _x(at: datetime, start: datetime, span: float, width: float) -> float:
    return 120 + width * max(min((at - start).total_seconds() / span, 1.0), 0.0)


def timeline_svg(view: JobView, now: datetime) -> str:
    """States, clusters (by zone) and the price paid on one time axis; notices and migrations marked."""
    job = view.job
    start = job.created_at
    end = job.finished_at or max([now, *(ev.at for ev in view.events)])
    span = max((end - start).total_seconds(), 1.0)
    width, parts = 760.0, []
    transitions = [ev for ev in view.events if ev.to_state]
    for i, ev in enumerate(transitions):
        until = transitions[i + 1].at if i + 1 < len(transitions) else end
        x0, x1 = _x(ev.at, start, span, width), _x(until, start, span, width)
        parts.append(f'<rect class="state-band" data-state="{e(ev.to_state)}" x="{x0:.1f}" y="20" '
                     f'width="{max(x1 - x0, 1.5):.1f}" height="22" '
                     f'fill="{STATE_COLOURS.get(ev.to_state or "", "#999")}">'
                     f'<title>{e(ev.to_state)} from {ev.at:%H:%M:%S}</title></rect>')
    parts.append('<text x="4" y="36" class="lane">state</text>')
    for row, (alloc, cluster) in enumerate(view.allocations):
        y = 52 + 26 * row
        x0 = _x(alloc.started_at, start, span, width)
        x1 = _x(alloc.ended_at or end, start, span, width)
        parts.append(f'<rect class="cluster-band" data-zone="{e(cluster.zone)}" x="{x0:.1f}" y="{y}" '
                     f'width="{max(x1 - x0, 1.5):.1f}" height="20" fill="#95a5a6"><title>{e(cluster.id)} '
                     f'{e(cluster.cloud)}/{e(cluster.zone)} attempt {alloc.attempt}</title></rect>'
                     f'<text x="4" y="{y + 15}" class="lane">{e(cluster.cloud)}/{e(cluster.zone)}</text>')
    lanes_bottom = 52 + 26 * max(len(view.allocations), 1)
    for notice, zone in view.notices:
        x = _x(notice.received_at, start, span, width)
        parts.append(f'<g class="marker notice" data-kind="{e(notice.kind)}"><line x1="{x:.1f}" x2="{x:.1f}" y1="14" '
                     f'y2="{lanes_bottom}" stroke="#c0392b" stroke-width="2"/><text x="{x + 3:.1f}" y="12" '
                     f'fill="#c0392b">{e(notice.kind)} notice ({e(zone)})</text></g>')
    moves = [ev for ev in view.events if ev.kind == "moving" or ev.to_state == JobState.MIGRATING.value]
    for ev in moves:
        x = _x(ev.at, start, span, width)
        target = (ev.detail or {}).get("to", "")
        parts.append(f'<g class="marker migration"><line x1="{x:.1f}" x2="{x:.1f}" y1="14" y2="{lanes_bottom}" '
                     f'stroke="#8e44ad" stroke-dasharray="4 2" stroke-width="2"/><title>migration {e(target)}</title>'
                     f'<text x="{x + 3:.1f}" y="{lanes_bottom - 2}" fill="#8e44ad">migration</text></g>')
    price_top, price_h = lanes_bottom + 10, 60
    if view.prices:
        top = max(p for _, p in view.prices) or 1.0
        points = " ".join(f"{_x(m, start, span, width):.1f},{price_top + price_h - price_h * p / top:.1f}"
                          for m, p in view.prices)
        parts.append(f'<polyline class="price" points="{points}" fill="none" stroke="#2f6fdb" stroke-width="1.5"/>'
                     f'<text x="4" y="{price_top + 14}" class="lane">$/h paid</text>'
                     f'<text x="{width + 124:.0f}" y="{price_top + 10}" class="lane">${top:,.2f}/h</text>')
    axis_y = price_top + price_h + 16
    parts.append(f'<text x="120" y="{axis_y}" class="lane">{start:%Y-%m-%d %H:%M:%S}</text>'
                 f'<text x="{width + 120:.0f}" y="{axis_y}" class="lane" text-anchor="end">'
                 f'{end:%Y-%m-%d %H:%M:%S} UTC</text>')
    return (f'<svg class="timeline" viewBox="0 0 {width + 200:.0f} {axis_y + 6}" width="100%" '
            f'role="img" aria-label="job timeline">{"".join(parts)}</svg>')


def job_live_html(view: JobView, now: datetime) -> str:
    """The part of the job page that refreshes itself: state, progress, timeline."""
    job = view.job
    progress = "unknown (the job file gives no work estimate)" if view.progress is None else \
        f'<progress max="1" value="{view.progress:.3f}"></progress> {100 * view.progress:.0f}%'
    finish = f", predicted finish {view.finish:%Y-%m-%d %H:%M} UTC" if view.finish else ""
    live = "" if job.finished_at else f' hx-get="/jobs/{e(job.id)}/live" hx-trigger="every 2s" hx-swap="outerHTML"'
    return (f'<section id="job-live"{live}><p>State {_state_badge(job.state)} · attempt {job.attempt} · '
            f'{job.preemptions} preemption(s) · {job.migrations} migration(s) · '
            f'{job.work_lost_s / 3600:,.2f} h of work lost · zones: {e(", ".join(job.zones or []) or "-")}</p>'
            f'{_reason(job)}<p>Progress: {progress}{finish}</p>{timeline_svg(view, now)}</section>')


def _reason(job: JobRow) -> str:
    """Why it waits (its team's share, a budget, a reclaim) or why it ended, as the engine wrote it."""
    return f'<p class="reason">Why: {e(job.reason)}</p>' if job.reason else ""


def _gpu_chart(view: JobView, now: datetime) -> str:
    end = view.job.finished_at or max([now, *(ev.at for ev in view.events)])
    marks = [("attempt", a.started_at, f"attempt {a.attempt} on {c.id}") for a, c in view.allocations]
    marks += [("notice", n.received_at, f"{n.kind} notice ({zone})") for n, zone in view.notices]
    marks += [("migration", ev.at, "migration") for ev in view.events
              if ev.kind == "moving" or ev.to_state == JobState.MIGRATING.value]
    return gpu_svg(view.gpu, view.checkpoints, marks, view.job.created_at, end)


def _sizing(view: JobView) -> str:
    if not view.sizing:
        return ""
    items = "".join(f'<li data-kind="{e(a.kind)}">{e(a.text)}</li>' for a in view.sizing)
    return f'<h3>Right-sizing (from its measured GPUs; never applied)</h3><ul class="rightsizing">{items}</ul>'


def render_job(view: JobView, home: Path, now: datetime) -> str:
    job = view.job
    ledger_rows = [[e(c), e(z), e(u), f"{n:.1f}", e(money(cost)), e(money(od))]
                   for c, z, u, n, cost, od in view.ledger]
    total = sum(r[4] for r in view.ledger)
    events = [[f"{ev.at:%Y-%m-%d %H:%M:%S}", e(ev.kind), e(ev.from_state or ""), e(ev.to_state or ""),
               e(", ".join(f"{k}={v}" for k, v in (ev.detail or {}).items())[:200])] for ev in view.events[-50:]]
    tail = log_tail(home, job.id)
    return (f'<p>{e(job.name)} · team {e(job.team)} · priority {job.priority} · {job.num_nodes} node(s) × '
            f'{job.gpus_per_node} {e(job.accelerator or "GPU")}</p>{job_live_html(view, now)}'
            f'<h2>GPU utilisation (measured)</h2>{_gpu_chart(view, now)}{_sizing(view)}'
            f'<h2>Ledger ({e(money(total))})</h2>'
            + table(["cluster", "zone", "usage", "minutes", "cost", "on-demand"], ledger_rows)
            + "<h2>Events</h2>" + table(["at", "event", "from", "to", "detail"], events)
            + f'<h2>Log tail</h2><pre class="log">{e(tail) or "no output yet"}</pre>')
