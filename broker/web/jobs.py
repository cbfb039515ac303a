"""Jobs: a sortable, filterable list of the viewer's jobs, and one job's page (timeline, ledger, logs)."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from sqlalchemy import func, select

from broker.errors import UserError
from broker.model import JobState
from broker.reports.rightsizing import job_suggestions
from broker.status.progress import UNKNOWN, JobProgress, Span, job_progress
from broker.store import Store
from broker.store.rollup import LedgerRollupRow
from broker.store.tables import AllocationRow, ClusterRow, JobEventRow, JobRow, LedgerRow, NoticeRow, ProgressRow
from broker.web.gpu_chart import gpu_svg, load_gpu
from broker.web.html import STATE_COLOURS, e, money, query, table
from broker.web.session import Viewer
from broker.web.timeline import Lanes, timeline_svg
from broker.web.times import Times
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
    after: str | None = None  # the last job of the page before (the next page's cursor)

    @classmethod
    def parse(cls, state: str | None, team: str | None, q: str | None, sort: str | None,
              order: str | None, after: str | None = None) -> JobFilter:
        """Unknown values are a ValueError naming the field; text filters are bounded."""
        if after and (len(after) > 32 or not re.fullmatch(r"[A-Za-z0-9_.-]+", after)):
            raise ValueError("after: expected a job id like j-0123abcd")
        if state and state.upper() not in {s.value for s in JobState}:
            raise ValueError(f"state: expected one of {', '.join(s.value for s in JobState)}")
        for name, value in (("team", team), ("q", q)):
            if value is not None and (len(value) > 100 or "\x00" in value):
                raise ValueError(f"{name}: expected at most 100 characters of text")
        if sort and sort not in (*SORTS, "cost"):
            raise ValueError(f"sort: expected one of {', '.join((*SORTS, 'cost'))}")
        if order and order not in ("asc", "desc"):
            raise ValueError("order: expected asc or desc")
        return cls(state.upper() if state else None, team or None, q or None, sort or "submitted", order != "asc",
                   after or None)


def latest_reports(s: Any, ids: list[str]) -> dict[str, tuple[int, int | None]]:
    """Each job's last progress report (step, total), as ``broker status`` reads it: latest time, then latest id."""
    if not ids:
        return {}
    newest = (select(ProgressRow.job_id, func.max(ProgressRow.at).label("at"))
              .where(ProgressRow.job_id.in_(ids)).group_by(ProgressRow.job_id).subquery())
    found: dict[str, tuple[int, tuple[int, int | None]]] = {}
    for job_id, row_id, step, total in s.execute(
            select(ProgressRow.job_id, ProgressRow.id, ProgressRow.step, ProgressRow.total)
            .join(newest, (newest.c.job_id == ProgressRow.job_id) & (newest.c.at == ProgressRow.at))):
        if job_id not in found or row_id > found[job_id][0]:
            found[job_id] = (row_id, (int(step), None if total is None else int(total)))
    return {job_id: report for job_id, (_, report) in found.items()}


def progress_of(job: JobRow, report: tuple[int, int | None] | None, spans: list[Span], now: datetime) -> JobProgress:
    """The job's one progress figure (``broker.status.progress``): the same as ``broker status`` prints."""
    return job_progress(job.state, report, job.work_s, job.work_lost_s, spans, now)


def list_jobs(store: Store, viewer: Viewer, where: JobFilter,
              now: datetime) -> tuple[list[dict[str, Any]], int, str | None]:
    """A page of the viewer's jobs, the number that match, and the next page's cursor (None: the last
    page); ``now`` is the broker's clock (progress and durations run on it)."""
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
            key: Any = func.coalesce(cost.c.cost, 0.0)
            stmt = stmt.outerjoin(cost, cost.c.job_id == JobRow.id)
        else:
            key = SORTS[where.sort]
        stmt = stmt.order_by(key.desc() if where.desc else key.asc(), JobRow.id)
        if where.after:
            # Keyset: the rows after the cursor's in the same order (its sort value, then the id).
            last = s.execute(stmt.with_only_columns(key).where(JobRow.id == where.after)).first()
            if last is None:
                raise NotFound(f"after: no job {where.after!r} that you can see with these filters")
            beyond = key < last[0] if where.desc else key > last[0]
            stmt = stmt.where(beyond | ((key == last[0]) & (JobRow.id > where.after)))
        jobs = list(s.scalars(stmt.limit(PAGE_SIZE + 1)))
        more = jobs[PAGE_SIZE - 1].id if len(jobs) > PAGE_SIZE else None
        jobs = jobs[:PAGE_SIZE]
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
        spans: dict[str, list[Span]] = {i: [] for i in ids}
        if ids:
            for job_id, started, running, ended in s.execute(
                    select(AllocationRow.job_id, AllocationRow.started_at, AllocationRow.running_at,
                           AllocationRow.ended_at).where(AllocationRow.job_id.in_(ids))):
                spans[job_id].append((started, running, ended))
        reports = latest_reports(s, ids)
        rows = []
        for job in jobs:
            rows.append({"id": job.id, "name": job.name, "team": job.team, "state": job.state,
                         "priority": job.priority, "where": "/".join(places.get(job.id, ())) or "-",
                         "cost": float(costs.get(job.id) or 0.0),
                         "progress": progress_of(job, reports.get(job.id), spans[job.id], now),
                         "submitted": job.created_at,
                         "duration": ((job.finished_at or now) - job.created_at).total_seconds(),
                         "preemptions": job.preemptions, "migrations": job.migrations,
                         "stage": (job.stage, job.pipeline_id) if job.stage else None})
    return rows, int(total), more


def _state_badge(state: str) -> str:
    return f'<span class="state" style="background:{STATE_COLOURS.get(state, "#999")}">{e(state)}</span>'


def progress_html(progress: JobProgress) -> str:
    """The figure every view prints, with a bar when it has a share."""
    bar = "" if progress.share is None else f'<progress max="1" value="{progress.share:.3f}"></progress> '
    share = "" if progress.share is None else f"{progress.share:.4f}"
    return (f'<span class="progress" data-source="{e(progress.source)}" data-share="{share}">'
            f'{bar}{e(progress.text())}</span>')


def job_rows_html(rows: list[dict[str, Any]], where: JobFilter, times: Times) -> str:
    params = query(state=where.state, team=where.team, q=where.q, sort=where.sort,
                   order="desc" if where.desc else "asc", after=where.after)
    body = []
    for r in rows:
        stage = "-" if r["stage"] is None else f"{r['stage'][0]} of {e(r['stage'][1])}"
        body.append(f'<tr data-job="{e(r["id"])}"><td><a href="/jobs/{e(r["id"])}">{e(r["id"])}</a></td>'
                    f'<td>{e(r["name"])}</td><td>{e(r["team"])}</td>'
                    f'<td class="job-state">{_state_badge(r["state"])}</td>'
                    f'<td>{r["priority"]}</td><td>{e(r["where"])}</td><td>{e(money(r["cost"]))}</td>'
                    f'<td class="job-progress">{progress_html(r["progress"])}</td>'
                    f'<td>{r["preemptions"]} / {r["migrations"]}</td><td>{stage}</td>'
                    f'<td>{e(times.span(r["duration"]))}</td><td>{times.at(r["submitted"])}</td></tr>')
    empty = f'<tr><td colspan="{len(COLUMNS)}" class="empty">No jobs match.</td></tr>' if not rows else ""
    return (f'<tbody id="job-rows" hx-get="/jobs/rows{e(params)}" hx-trigger="every 2s" hx-swap="outerHTML">'
            f'{"".join(body)}{empty}</tbody>')


COLUMNS = (("job", None), ("name", "name"), ("team", "team"), ("state", "state"), ("priority", "priority"),
           ("where", None), ("cost", "cost"), ("progress", None), ("preemptions / migrations", None),
           ("pipeline stage", None), ("duration", None), ("submitted", "submitted"))


def render_list(rows: list[dict[str, Any]], total: int, where: JobFilter, viewer: Viewer, times: Times,
                more: str | None = None) -> str:
    states = "".join(f'<option{" selected" if s.value == where.state else ""}>{s.value}</option>' for s in JobState)
    team = (f'<label>team <input name="team" value="{e(where.team or "")}"></label>' if viewer.admin else "")
    form = (f'<form class="filters" method="get" action="/jobs"><label>state <select name="state">'
            f'<option value="">any</option>{states}</select></label>{team}'
            f'<label>name or id <input name="q" value="{e(where.q or "")}"></label>'
            f'<input type="hidden" name="sort" value="{e(where.sort)}">'
            f'<input type="hidden" name="order" value="{"desc" if where.desc else "asc"}">'
            f'<button type="submit">Filter</button></form>')
    heads = []
    for label, key in COLUMNS:
        if key is None:
            heads.append(label)
            continue
        desc = not (where.sort == key and where.desc)
        arrow = (" ▼" if where.desc else " ▲") if where.sort == key else ""
        href = "/jobs" + query(state=where.state, team=where.team, q=where.q, sort=key, order="desc" if desc else "asc")
        heads.append(f'<a href="{e(href)}">{label}{arrow}</a>')
    head = "".join(f"<th>{h}</th>" for h in heads)
    kept = {"state": where.state, "team": where.team, "q": where.q, "sort": where.sort,
            "order": "desc" if where.desc else "asc"}
    pages = [f'<a href="/jobs{e(query(**kept))}" rel="first">first page</a>'] if where.after else []
    if more:
        pages.append(f'<a href="/jobs{e(query(**kept, after=more))}" rel="next">next {PAGE_SIZE}</a>')
    shown = (f"<p>{len(rows)} of {total} job(s){f' ({PAGE_SIZE} a page)' if total > PAGE_SIZE else ''}. "
             f'<span class="pages">{" · ".join(pages)}</span></p>')
    return (f'{form}{shown}{times.note()}<table class="jobs"><thead><tr>{head}</tr></thead>'
            f'{job_rows_html(rows, where, times)}</table>')


# --- one job ---------------------------------------------------------------------------------------


@dataclass
class JobView(Lanes):
    ledger: list[tuple[str, str, str, float, float, float]]  # cluster, zone, usage, minutes billed, cost, on-demand
    progress: JobProgress
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
        spans: list[Span] = [(a.started_at, a.running_at, a.ended_at) for a, _ in allocations]
        progress = progress_of(job, latest_reports(s, [job_id]).get(job_id), spans, now)
        gpu, checkpoints = load_gpu(s, job_id)
        sizing = job_suggestions(s, job)
        s.expunge_all()
    return JobView(job, events, allocations, notices, prices, ledger, progress, gpu, checkpoints, sizing)


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


def _reason(job: JobRow) -> str:
    """Why the job failed, was cancelled or waits: first on its page."""
    if not job.reason:
        return ""
    if job.state != JobState.FAILED.value:  # why it waits (its team's share, a budget, a reclaim) or ended
        return f'<p class="reason" data-reason>Why: {e(job.reason)}</p>'
    exit_code = f" (exit code {job.exit_code})" if job.exit_code is not None else ""
    return f'<p class="error" role="alert" data-reason>{e(job.state)}{exit_code}: {e(job.reason)}</p>'


def job_live_html(view: JobView, now: datetime, times: Times) -> str:
    """The part of the job page that refreshes itself: why it failed, state, progress, timeline."""
    job = view.job
    progress = ("unknown (no progress reported and the job file gives no work estimate)"
                if view.progress.source == UNKNOWN else progress_html(view.progress))
    finish = f", finish at this pace {times.at(view.progress.finish)}" if view.progress.finish else ""
    live = "" if job.finished_at else f' hx-get="/jobs/{e(job.id)}/live" hx-trigger="every 2s" hx-swap="outerHTML"'
    ran = times.span(((job.finished_at or now) - job.created_at).total_seconds())
    return (f'<section id="job-live"{live}>{_reason(job)}<p>State {_state_badge(job.state)} · attempt {job.attempt} · '
            f'{job.preemptions} preemption(s) · {job.migrations} migration(s) · '
            f'{e(times.span(job.work_lost_s))} of work lost · zones: {e(", ".join(job.zones or []) or "-")}</p>'
            f'<p>Submitted {times.at(job.created_at)} · {"took" if job.finished_at else "running for"} {e(ran)}</p>'
            f'<p class="job-progress">Progress: {progress}{finish}</p>{timeline_svg(view, now, times)}</section>')


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


def render_job(view: JobView, home: Path, now: datetime, times: Times) -> str:
    job = view.job
    ledger_rows = [[e(c), e(z), e(u), f"{n:.1f}", e(money(cost)), e(money(od))]
                   for c, z, u, n, cost, od in view.ledger]
    total = sum(r[4] for r in view.ledger)
    events = [[times.at(ev.at, seconds=True), e(ev.kind), e(ev.from_state or ""), e(ev.to_state or ""),
               e(", ".join(f"{k}={v}" for k, v in (ev.detail or {}).items())[:200])] for ev in view.events[-50:]]
    tail = log_tail(home, job.id)
    stage = f" · stage {job.stage} of pipeline {e(job.pipeline_id)}" if job.stage else ""
    return (f'<p>{e(job.name)} · team {e(job.team)} · priority {job.priority} · {job.num_nodes} node(s) × '
            f'{job.gpus_per_node} {e(job.accelerator or "GPU")}{stage}</p>{times.note()}'
            f'{job_live_html(view, now, times)}'
            f'<h2>GPU utilisation (measured)</h2>{_gpu_chart(view, now)}{_sizing(view)}'
            f'<h2>Ledger ({e(money(total))})</h2>'
            + table(["cluster", "zone", "usage", "minutes", "cost", "on-demand"], ledger_rows)
            + "<h2>Events</h2>" + table(["at", "event", "from", "to", "detail"], events)
            + f'<h2>Log tail</h2><pre class="log">{e(tail) or "no output yet"}</pre>')
