"""A built report as a terminal table, plain text, JSON, CSV or (email-safe, inline-styled) HTML."""

from __future__ import annotations

import csv
import io
import json
from html import escape

from rich import box
from rich.console import Console
from rich.table import Table

from broker.reports.model import CAUSE_LABELS, IDLE_CAUSES, Figures, Group, Report

FORMATS = ("table", "json", "csv", "html")
GROUP_TITLES = {"team": "By team", "cloud": "By cloud", "region": "By region", "gpu": "By GPU type", "job": "Top jobs"}
TABLE_ROWS = 10  # per grouping in the table and HTML; JSON and CSV carry every row


def money(value: float) -> str:
    return f"-${-value:,.2f}" if value < 0 else f"${value:,.2f}"


def _causes(figures: Figures) -> list[str]:
    extra = sorted(set(figures.idle_gpu_hours) - set(IDLE_CAUSES))
    return [c for c in IDLE_CAUSES if c in figures.idle_gpu_hours] + extra


def summary_lines(report: Report) -> list[str]:
    t = report.totals
    return [*_main_lines(t), *_measured_lines(t), *_sharing_lines(t)]


def _measured_lines(t: Figures) -> list[str]:
    """What the GPUs themselves said: idle time inside running jobs, and what no GPU figure covers."""
    lines = []
    held = t.idle_gpu_hours.get("held_idle", 0.0)
    if held:
        parts = ", ".join(f"{name} {t.held_idle_parts.get(name, 0.0):,.1f}" for name in ("startup", "checkpoint",
                                                                                          "stalled"))
        lines.append(f"Held idle by running jobs (GPUs measured idle): {held:,.1f} GPU-h "
                     f"({money(t.idle_cost.get('held_idle', 0.0))}): {parts}")
    if t.unmeasured_gpu_hours > 0.05 or t.measured_gpu_hours:
        lines.append(f"GPU utilisation measured on {t.measured_gpu_hours:,.1f} GPU-h of running jobs; "
                     f"{t.unmeasured_gpu_hours:,.1f} GPU-h not measured (counted useful)")
    return lines


def _sharing_lines(t: Figures) -> list[str]:
    """Fragmentation of shared GPUs: the fractions held, and what they left stranded beside them."""
    if not t.shared_gpu_hours and not t.stranded_gpu_hours:
        return []
    shared = t.shared_gpu_hours + t.stranded_gpu_hours
    return [f"GPU sharing: {t.shared_gpu_hours:,.1f} GPU-h held as fractions of GPUs, {t.stranded_gpu_hours:,.1f} "
            f"GPU-h stranded beside them ({100 * t.stranded_gpu_hours / shared:.0f}% of the shared GPUs' time)"]


def _main_lines(t: Figures) -> list[str]:
    return [
        f"Spend {money(t.spend)} vs {money(t.on_demand)} on-demand: saved {money(t.saving)} ({t.saving_pct:.1f}%)",
        f"{t.gpu_hours:,.1f} GPU-hours ({t.useful_gpu_hours:,.1f} useful, {t.idle_total_gpu_hours:,.1f} idle), "
        f"{100 * t.spot_share:.0f}% on spot, {t.jobs} job(s)",
        f"{t.preemptions} preemption(s), {t.migrations} migration(s), {t.work_lost_s / 3600:,.1f} h of work lost, "
        f"restart overhead {t.restart_gpu_hours:,.1f} GPU-h ({money(t.restart_cost)})",
    ]


# --- terminal table and plain text ---

def _group_table(title: str, groups: list[Group]) -> Table:
    table = Table(title=title, title_justify="left", box=box.SIMPLE_HEAD, pad_edge=False)
    table.add_column("", max_width=32, overflow="ellipsis", no_wrap=True)
    for name in GROUP_COLUMNS:
        table.add_column(name.replace(" ", "\n", 1), justify="right", no_wrap=True)
    for g in groups[:TABLE_ROWS]:
        table.add_row(g.label, *_group_cells(g.figures))
    if len(groups) > TABLE_ROWS:
        table.caption = f"{len(groups) - TABLE_ROWS} more in --format json or csv"
    return table


GROUP_COLUMNS = ("spend", "on-demand", "saved", "saved %", "GPU-h", "spot %", "preempt", "migr",
                 "work lost h", "restart GPU-h", "idle GPU-h")


def _group_cells(f: Figures) -> list[str]:
    return [money(f.spend), money(f.on_demand), money(f.saving), f"{f.saving_pct:.1f}", f"{f.gpu_hours:,.1f}",
            f"{100 * f.spot_share:.0f}", str(f.preemptions), str(f.migrations), f"{f.work_lost_s / 3600:.1f}",
            f"{f.restart_gpu_hours:.1f}", f"{f.idle_total_gpu_hours:.1f}"]


def _idle_table(report: Report) -> Table:
    t = report.totals
    table = Table(title="Idle GPU-hours by cause", title_justify="left", box=box.SIMPLE_HEAD, pad_edge=False)
    for name in ("cause", "GPU-h", "cost", "% of allocated"):
        table.add_column(name, justify="left" if name == "cause" else "right")
    for cause in _causes(t):
        hours = t.idle_gpu_hours[cause]
        share = 100 * hours / t.gpu_hours if t.gpu_hours else 0.0
        table.add_row(CAUSE_LABELS.get(cause, cause), f"{hours:,.1f}", money(t.idle_cost.get(cause, 0.0)),
                      f"{share:.1f}")
    table.add_row("total idle", f"{t.idle_total_gpu_hours:,.1f}", money(sum(t.idle_cost.values())),
                  f"{100 * t.idle_total_gpu_hours / t.gpu_hours if t.gpu_hours else 0.0:.1f}", style="bold")
    return table


def print_table(report: Report, console: Console) -> None:
    console.print(f"[bold]{escape_markup(report.title)}[/bold]")
    for line in summary_lines(report):
        console.print(line, highlight=False)
    console.print()
    console.print(_idle_table(report))
    for dimension in ("team", "cloud", "region", "gpu", "job"):
        console.print()
        console.print(_group_table(GROUP_TITLES[dimension], report.groups.get(dimension, [])))
    console.print()
    console.print("[bold]Largest wastes[/bold]")
    if not report.wastes:
        console.print("none: every GPU-minute in the window was held by a running job")
    for i, waste in enumerate(report.wastes, 1):
        console.print(f"{i}. {escape_markup(waste.suggestion)}", highlight=False)
    if report.right_sizing:
        console.print()
        console.print("[bold]Right-sizing (finished jobs, from their measured GPUs; never applied)[/bold]")
    for line in right_sizing_lines(report):
        console.print(escape_markup(line), highlight=False)


def right_sizing_lines(report: Report) -> list[str]:
    """One line per suggestion: the job (a name from the store, escaped by each renderer), then the advice."""
    return [f"- {entry['label']} [{entry['job_id']}]: {s['text']}"
            for entry in report.right_sizing for s in entry["suggestions"]]


def escape_markup(text: str) -> str:
    from rich.markup import escape as rich_escape

    return rich_escape(text)


def render_text(report: Report, width: int = 132) -> str:
    buffer = io.StringIO()
    print_table(report, Console(file=buffer, width=width, color_system=None, force_terminal=False,
                                 legacy_windows=False))
    return buffer.getvalue()


# --- JSON and CSV ---

def render_json(report: Report) -> str:
    return json.dumps(report.to_dict(), indent=2, sort_keys=False)


CSV_COLUMNS = ("group", "key", "label", "spend", "on_demand", "saving", "saving_pct", "gpu_hours",
               "useful_gpu_hours", "spot_share", "jobs", "preemptions", "migrations", "work_lost_hours",
               "restart_gpu_hours", "restart_cost", *(f"idle_{c}_gpu_hours" for c in IDLE_CAUSES))


def render_csv(report: Report) -> str:
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(CSV_COLUMNS)
    rows = [("total", "total", report.title, report.totals)]
    rows += [(d, g.key, g.label, g.figures) for d, groups in report.groups.items() for g in groups]
    for dimension, key, label, f in rows:
        writer.writerow([dimension, key, label, f"{f.spend:.4f}", f"{f.on_demand:.4f}", f"{f.saving:.4f}",
                         f"{f.saving_pct:.2f}", f"{f.gpu_hours:.4f}", f"{f.useful_gpu_hours:.4f}",
                         f"{f.spot_share:.4f}", f.jobs, f.preemptions, f.migrations, f"{f.work_lost_s / 3600:.4f}",
                         f"{f.restart_gpu_hours:.4f}", f"{f.restart_cost:.4f}"]
                        + [f"{f.idle_gpu_hours.get(c, 0.0):.4f}" for c in IDLE_CAUSES])
    return buffer.getvalue()


# --- HTML (inline styles: mail clients drop <style> blocks) ---

_TD = 'style="padding:3px 8px;border-bottom:1px solid #e5e5e5;text-align:right"'
_TDL = 'style="padding:3px 8px;border-bottom:1px solid #e5e5e5;text-align:left"'
_TH = 'style="padding:3px 8px;border-bottom:2px solid #999;text-align:right;font-weight:600"'


def _html_table(headers: list[str], rows: list[list[str]]) -> str:
    head = "".join(f"<th {_TH}>{escape(h)}</th>" for h in headers)
    body = "".join(
        "<tr>" + "".join(f"<td {_TDL if i == 0 else _TD}>{escape(cell)}</td>" for i, cell in enumerate(row)) + "</tr>"
        for row in rows
    )
    return f'<table style="border-collapse:collapse;font-size:13px"><tr>{head}</tr>{body}</table>'


def render_html(report: Report, chart_cid: str | None = None, inline_chart: bool = True) -> str:
    """HTML for mail (the chart by ``chart_cid``, attached beside it) or a file (the chart inline, as a data URI)."""
    t = report.totals
    parts = [f'<div style="font-family:Helvetica,Arial,sans-serif;color:#222"><h2>{escape(report.title)}</h2>']
    parts += [f"<p style='margin:2px 0'>{escape(line)}</p>" for line in summary_lines(report)]
    alt = "Spend per day by cloud vs its on-demand equivalent"
    if chart_cid:
        parts.append(f'<p><img src="cid:{escape(chart_cid)}" alt="{alt}" width="810"></p>')
    elif inline_chart:
        import base64

        from broker.reports.charts import daily_spend_png

        data = base64.b64encode(daily_spend_png(report)).decode("ascii")
        parts.append(f'<p><img src="data:image/png;base64,{data}" alt="{alt}" width="810"></p>')
    parts.append("<h3>Idle GPU-hours by cause</h3>")
    parts.append(_html_table(
        ["cause", "GPU-h", "cost", "% of allocated"],
        [[CAUSE_LABELS.get(c, c), f"{t.idle_gpu_hours[c]:,.1f}", money(t.idle_cost.get(c, 0.0)),
          f"{100 * t.idle_gpu_hours[c] / t.gpu_hours if t.gpu_hours else 0.0:.1f}"] for c in _causes(t)],
    ))
    parts.append("<h3>Largest wastes</h3><ol>")
    parts += [f"<li>{escape(w.suggestion)}</li>" for w in report.wastes] or ["<li>none</li>"]
    parts.append("</ol>")
    if report.right_sizing:
        parts.append("<h3>Right-sizing (finished jobs, from their measured GPUs; never applied)</h3><ul>")
        parts += [f"<li>{escape(line[2:])}</li>" for line in right_sizing_lines(report)]
        parts.append("</ul>")
    for dimension in ("team", "cloud", "region", "gpu", "job"):
        groups = report.groups.get(dimension, [])
        parts.append(f"<h3>{GROUP_TITLES[dimension]}</h3>")
        rows = [[g.label, *_group_cells(g.figures)] for g in groups[:TABLE_ROWS]]
        parts.append(_html_table(["", *GROUP_COLUMNS], rows))
    parts.append(f"<p style='color:#777;font-size:11px'>Generated {report.generated_at:%Y-%m-%d %H:%M} UTC from "
                 f"the broker's cost ledger (every minute priced at the price paid).</p></div>")
    return "\n".join(parts)
