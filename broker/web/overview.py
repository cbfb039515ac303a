"""Overview: the cost report for a chosen window (built by the report builder itself), with charts."""

from __future__ import annotations

import json
from datetime import UTC, datetime

from broker.reports.build import build_report
from broker.reports.model import CAUSE_LABELS, IDLE_CAUSES, Report
from broker.reports.window import Window
from broker.store import Store
from broker.web.html import e, money, table
from broker.web.session import Viewer
from broker.web.times import Times

SINCE_CHOICES = ("1d", "7d", "30d", "90d")
SHOWN_GROUPS = ("team", "cloud", "gpu")
SHOWN_ROWS = 10


def build(store: Store, viewer: Viewer, window: Window) -> Report:
    """The report with the groupings the page draws (the per-job one, 10,000 rows a month, is left out)."""
    return build_report(store, window, team=viewer.scope, dimensions=SHOWN_GROUPS)


def _card(label: str, value: str, key: str) -> str:
    return (f'<div class="card"><div class="label">{e(label)}</div>'
            f'<div class="value" data-figure="{e(key)}">{e(value)}</div></div>')


def daily_chart_data(report: Report) -> dict[str, object]:
    """A bar per UTC day of the window, stacked by cloud (the report chart's colours), each framed by the
    day's on-demand equivalent (a dashed outline: what the same hours would have cost on demand)."""
    from broker.reports.charts import cloud_colours, window_days

    days = [d.isoformat() for d in window_days(report)]
    index = {d: i for i, d in enumerate(days)}
    clouds = sorted({p.cloud for p in report.daily})
    colours = cloud_colours(clouds)
    spend = {c: [0.0] * len(days) for c in clouds}
    on_demand = [0.0] * len(days)
    for point in report.daily:
        i = index.get(point.day)
        if i is not None:
            spend[point.cloud][i] += point.spend
            on_demand[i] += point.on_demand
    stamps = [int(datetime.fromisoformat(d).replace(tzinfo=UTC).timestamp()) + 43200 for d in days]
    # The legend carries each series' total over the window (it does not follow the cursor).
    series: list[dict[str, object]] = [{"label": f"{c} spend ({money(sum(spend[c]))})", "colour": colours[c],
                                        "values": [round(v, 4) for v in spend[c]], "bars": True} for c in clouds]
    series.append({"label": f"on-demand equivalent ({money(sum(on_demand))})", "colour": "#222222",
                   "values": [round(v, 4) for v in on_demand], "outline": True})
    return {"x": stamps, "series": series, "ylabel": "USD per day", "stacked": True, "days": True,
            "legend": "static"}


def _wall_window(report: Report, times: Times) -> str:
    """On a replay the window is on the market's clock (what the ledger bills): say when that was on the wall."""
    if not times.replay:
        return times.note()
    return (f'{times.note()}<p class="window-wall">Window on the wall clock: {times.at(report.start)} to '
            f'{times.at(report.end)}</p>')


def chart_div(data: dict[str, object], title: str) -> str:
    payload = json.dumps(data).replace("</", "<\\/")
    return f'<figure class="chart"><figcaption>{e(title)}</figcaption><div data-chart="{e(payload)}"></div></figure>'




def shown_json(report: Report) -> dict[str, object]:
    """The report's JSON (as `broker report --format json`) cut to what the page shows: every group
    but the top rows of the groupings drawn is left out (a month of 10,000 jobs is megabytes)."""
    from dataclasses import replace

    shown = replace(report, groups={d: rows[:SHOWN_ROWS] for d, rows in report.groups.items() if d in SHOWN_GROUPS})
    return shown.to_dict()


def render(report: Report, since: str | None, start: str | None, end: str | None, times: Times) -> str:
    t = report.totals
    chosen = since or ("" if start else "7d")
    choices = "".join(f'<option value="{c}"{" selected" if c == chosen else ""}>{c}</option>' for c in SINCE_CHOICES)
    form = (f'<form class="window" method="get" action="/"><label>last <select name="since">'
            f'<option value="">—</option>{choices}</select></label>'
            f'<label>or from <input name="from" value="{e(start or "")}" placeholder="2026-03-02"></label>'
            f'<label>to <input name="to" value="{e(end or "")}" placeholder="now"></label>'
            f'<button type="submit">Show</button></form>'
            f'<p class="window-text">{e(report.title)}</p>{_wall_window(report, times)}')
    cards = "".join([
        _card("Spend", money(t.spend), "spend"),
        _card("On-demand would have cost", money(t.on_demand), "on_demand"),
        _card("Saved", f"{money(t.saving)} ({t.saving_pct:.1f}%)", "saving"),
        _card("Preemptions", str(t.preemptions), "preemptions"),
        _card("Migrations", str(t.migrations), "migrations"),
        _card("Work lost", f"{t.work_lost_s / 3600:,.2f} h", "work_lost_hours"),
        _card("GPU-hours", f"{t.gpu_hours:,.2f}", "gpu_hours"),
        _card("Idle GPU-hours", f"{t.idle_total_gpu_hours:,.2f}", "idle_total_gpu_hours"),
    ])
    causes = [c for c in IDLE_CAUSES if c in t.idle_gpu_hours] + sorted(set(t.idle_gpu_hours) - set(IDLE_CAUSES))
    top = max([t.idle_gpu_hours[c] for c in causes] or [0.0]) or 1.0
    idle_rows = [[e(CAUSE_LABELS.get(c, c)), f"{t.idle_gpu_hours[c]:,.2f}", e(money(t.idle_cost.get(c, 0.0))),
                  f'<span class="bar" style="width:{int(200 * t.idle_gpu_hours[c] / top)}px"></span>']
                 for c in causes]
    idle = table(["cause", "GPU-hours", "cost", ""], idle_rows, 'class="idle"') if idle_rows else \
        "<p>No idle GPU-hours in the window.</p>"
    groups = []
    for dimension, title in zip(SHOWN_GROUPS, ("By team", "By cloud", "By GPU type"), strict=True):
        shown = report.groups.get(dimension, [])[:SHOWN_ROWS]
        if dimension == "gpu":  # the report keys a CPU-only instance by its type: listed apart, not as a GPU
            cpu = [g for g in shown if not g.figures.gpu_hours]
            shown = [g for g in shown if g.figures.gpu_hours]
        rows = [[e(g.label), e(money(g.figures.spend)), e(money(g.figures.on_demand)),
                 f"{g.figures.saving_pct:.1f}%", f"{g.figures.gpu_hours:,.2f}", str(g.figures.preemptions)]
                for g in shown]
        apart = ""
        if dimension == "gpu" and cpu:
            apart = ('<p class="cpu-only">CPU-only instances (no GPU-hours): '
                     + ", ".join(f"{e(g.label)} {e(money(g.figures.spend))}" for g in cpu) + "</p>")
        groups.append(f'<section data-group="{dimension}"><h3>{title}</h3>'
                      + table(["", "spend", "on-demand", "saved", "GPU-h", "preemptions"], rows) + apart + "</section>")
    chart = chart_div(daily_chart_data(report), "Spend per UTC day by cloud (stacked), framed by its on-demand "
                      "equivalent (dashed), USD") if report.daily else \
        '<p class="empty">No ledger minutes in the window: nothing to chart.</p>'
    wastes = "".join(f"<li>{e(w.suggestion)}</li>" for w in report.wastes[:5]) or "<li>none</li>"
    data = json.dumps(shown_json(report)).replace("</", "<\\/")
    return (f"{form}<div class=cards>{cards}</div>{chart}<h2>Idle GPU-hours by cause</h2>{idle}"
            f"<h2>Largest wastes</h2><ol>{wastes}</ol><div class=groups>{''.join(groups)}</div>"
            f'<script type="application/json" id="report-json">{data}</script>')
