"""The job page's timeline: states, clusters (by zone) and the price paid on one time axis, with a legend."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from broker.model import JobState
from broker.store.tables import AllocationRow, ClusterRow, JobEventRow, JobRow, NoticeRow
from broker.web.html import STATE_COLOURS, e
from broker.web.times import Times

WIDTH, LEFT = 760.0, 120
PRICE_TICKS = 3  # labelled lines on the $/h axis: 0, half and the top


def _x(at: datetime, start: datetime, span: float) -> float:
    return LEFT + WIDTH * max(min((at - start).total_seconds() / span, 1.0), 0.0)


def state_legend(states: list[str]) -> str:
    """What each colour of the state band means (the states the job went through, in the machine's order)."""
    order = [s.value for s in JobState if s.value in states]
    items = "".join(f'<span class="legend-item" data-state="{e(s)}"><span class="swatch" '
                    f'style="background:{STATE_COLOURS.get(s, "#999")}"></span>{e(s)}</span>' for s in order)
    marks = ('<span class="legend-item"><span class="swatch line" style="border-color:#c0392b"></span>notice</span>'
             '<span class="legend-item"><span class="swatch line dashed" style="border-color:#8e44ad"></span>'
             'migration</span><span class="legend-item"><span class="swatch line" style="border-color:#2f6fdb">'
             '</span>$/h paid</span>')
    return f'<div class="legend timeline-legend">{items}{marks}</div>'


@dataclass
class Lanes:
    """What the timeline draws of one job (the job page's ``JobView`` has these and more)."""

    job: JobRow
    events: list[JobEventRow]
    allocations: list[tuple[AllocationRow, ClusterRow]]
    notices: list[tuple[NoticeRow, str]]
    prices: list[tuple[datetime, float]]  # (minute, USD per hour paid for the job's GPUs)


def timeline_svg(view: Lanes, now: datetime, times: Times) -> str:
    job = view.job
    start = job.created_at
    end = job.finished_at or max([now, *(ev.at for ev in view.events)])
    span = max((end - start).total_seconds(), 1.0)
    parts = []
    transitions = [ev for ev in view.events if ev.to_state]
    for i, ev in enumerate(transitions):
        until = transitions[i + 1].at if i + 1 < len(transitions) else end
        x0, x1 = _x(ev.at, start, span), _x(until, start, span)
        parts.append(f'<rect class="state-band" data-state="{e(ev.to_state)}" x="{x0:.1f}" y="20" '
                     f'width="{max(x1 - x0, 1.5):.1f}" height="22" '
                     f'fill="{STATE_COLOURS.get(ev.to_state or "", "#999")}">'
                     f'<title>{e(ev.to_state)} from {e(times.plain(ev.at, seconds=True))}</title></rect>')
    parts.append('<text x="4" y="36" class="lane">state</text>')
    for row, (alloc, cluster) in enumerate(view.allocations):
        y = 52 + 26 * row
        x0 = _x(alloc.started_at, start, span)
        x1 = _x(alloc.ended_at or end, start, span)
        parts.append(f'<rect class="cluster-band" data-zone="{e(cluster.zone)}" x="{x0:.1f}" y="{y}" '
                     f'width="{max(x1 - x0, 1.5):.1f}" height="20" fill="#95a5a6"><title>{e(cluster.id)} '
                     f'{e(cluster.cloud)}/{e(cluster.zone)} attempt {alloc.attempt}</title></rect>'
                     f'<text x="4" y="{y + 15}" class="lane">{e(cluster.cloud)}/{e(cluster.zone)}</text>')
    lanes_bottom = 52 + 26 * max(len(view.allocations), 1)
    for notice, zone in view.notices:
        x = _x(notice.received_at, start, span)
        parts.append(f'<g class="marker notice" data-kind="{e(notice.kind)}"><line x1="{x:.1f}" x2="{x:.1f}" y1="14" '
                     f'y2="{lanes_bottom}" stroke="#c0392b" stroke-width="2"/><text x="{x + 3:.1f}" y="12" '
                     f'fill="#c0392b">{e(notice.kind)} notice ({e(zone)})</text></g>')
    moves = [ev for ev in view.events if ev.kind == "moving" or ev.to_state == JobState.MIGRATING.value]
    for ev in moves:
        x = _x(ev.at, start, span)
        target = (ev.detail or {}).get("to", "")
        parts.append(f'<g class="marker migration"><line x1="{x:.1f}" x2="{x:.1f}" y1="14" y2="{lanes_bottom}" '
                     f'stroke="#8e44ad" stroke-dasharray="4 2" stroke-width="2"/><title>migration {e(target)}</title>'
                     f'<text x="{x + 3:.1f}" y="{lanes_bottom - 2}" fill="#8e44ad">migration</text></g>')
    price_top, price_h = lanes_bottom + 14, 60
    if view.prices:
        top = max(p for _, p in view.prices) or 1.0

        def y_of(price: float) -> float:
            return price_top + price_h - price_h * price / top

        for i in range(PRICE_TICKS):
            value = top * i / (PRICE_TICKS - 1)
            parts.append(f'<line class="price-axis" x1="{LEFT}" x2="{WIDTH + LEFT:.0f}" y1="{y_of(value):.1f}" '
                         f'y2="{y_of(value):.1f}" stroke="#e3e3e3"/><text x="{LEFT - 4}" y="{y_of(value) + 4:.1f}" '
                         f'class="lane tick" text-anchor="end">${value:,.2f}</text>')
        points = " ".join(f"{_x(m, start, span):.1f},{y_of(p):.1f}" for m, p in view.prices)
        parts.append(f'<polyline class="price" points="{points}" fill="none" stroke="#2f6fdb" stroke-width="1.5"/>'
                     f'<text x="4" y="{price_top + 14}" class="lane">$/h paid</text>'
                     f'<text x="4" y="{price_top + 28}" class="lane">(USD/hour)</text>')
    axis_y = price_top + price_h + 18
    parts.append(f'<text x="{LEFT}" y="{axis_y}" class="lane">{e(times.plain(start, seconds=True))}</text>'
                 f'<text x="{WIDTH + LEFT:.0f}" y="{axis_y}" class="lane" text-anchor="end">'
                 f'{e(times.plain(end, seconds=True))}</text>')
    svg = (f'<svg class="timeline" viewBox="0 0 {WIDTH + 200:.0f} {axis_y + 6}" width="100%" '
           f'role="img" aria-label="job timeline">{"".join(parts)}</svg>')
    return svg + state_legend([ev.to_state for ev in transitions if ev.to_state])
