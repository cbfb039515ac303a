"""The report's chart: spend per day stacked by cloud, against its on-demand equivalent, as PNG bytes.

One bar per UTC day of the window (days without spend stay as gaps at zero), one colour per
cloud chosen to stay apart for colour-blind readers, and the legend below the plot so it never
covers a bar.
"""

from __future__ import annotations

import io
from collections import defaultdict
from datetime import date, timedelta
from typing import Any

from broker.reports.model import Report

# Okabe-Ito colours: distinguishable with the common colour-vision deficiencies.
CLOUD_COLOURS = {"aws": "#E69F00", "gcp": "#0072B2", "azure": "#009E73"}
_FALLBACK = ("#CC79A7", "#D55E00", "#56B4E9", "#F0E442")
ON_DEMAND_COLOUR = "#222222"
MAX_DAYS = 400


def cloud_colours(clouds: list[str]) -> dict[str, str]:
    others = iter(_FALLBACK)
    return {c: CLOUD_COLOURS.get(c) or next(others, "#999999") for c in clouds}


def window_days(report: Report) -> list[date]:
    """Every UTC day the window touches (at most MAX_DAYS, the latest kept)."""
    first = report.start.date()
    last = (report.end - timedelta(microseconds=1)).date()
    count = min((last - first).days + 1, MAX_DAYS)
    return [last - timedelta(days=count - 1 - i) for i in range(max(count, 1))]


def draw(report: Report) -> Any:
    """The matplotlib Figure (object API with the Agg canvas: no pyplot state, safe in the service's threads)."""
    import matplotlib.dates as mdates
    import numpy as np
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    spend: dict[str, dict[date, float]] = defaultdict(dict)
    on_demand: dict[date, float] = defaultdict(float)
    for point in report.daily:
        day = date.fromisoformat(point.day)
        spend[point.cloud][day] = spend[point.cloud].get(day, 0.0) + point.spend
        on_demand[day] += point.on_demand
    days = window_days(report)
    x = np.array(days, dtype="datetime64[D]")

    figure = Figure(figsize=(9, 4.2), dpi=100)
    FigureCanvasAgg(figure)
    axes = figure.add_subplot()
    bottom = np.zeros(len(days))
    colours = cloud_colours(sorted(spend))
    for cloud in sorted(spend):
        values = np.array([spend[cloud].get(d, 0.0) for d in days])
        axes.bar(x, values, width=0.8, bottom=bottom, color=colours[cloud], label=f"{cloud} spend",
                 edgecolor="white", linewidth=0.5)
        bottom += values
    if report.daily:
        axes.plot(x, [on_demand.get(d, 0.0) for d in days], color=ON_DEMAND_COLOUR, marker="_", markersize=14,
                  linestyle="none", markeredgewidth=2, label="on-demand equivalent (all clouds)")
    axes.set_title("Spend per day by cloud vs its on-demand equivalent (USD, UTC days)", fontsize=10)
    axes.set_ylabel("USD per day")
    axes.set_ylim(bottom=0)
    axes.grid(axis="y", alpha=0.3)
    axes.spines[["top", "right"]].set_visible(False)
    step = max(1, len(days) // 12)
    axes.xaxis.set_major_locator(mdates.DayLocator(interval=step))
    axes.xaxis.set_major_formatter(mdates.DateFormatter("%b %d"))
    axes.set_xlim(x[0] - np.timedelta64(1, "D"), x[-1] + np.timedelta64(1, "D"))
    if report.daily:
        # Below the axes: a legend there can never hide a bar.
        axes.legend(loc="upper center", bbox_to_anchor=(0.5, -0.14), ncols=min(len(spend) + 1, 4), fontsize=8,
                    frameon=False)
    else:
        axes.text(0.5, 0.5, "no ledger minutes in the window", ha="center", va="center", transform=axes.transAxes)
        axes.set_ylim(0, 1)
    figure.tight_layout()
    return figure


def daily_spend_png(report: Report) -> bytes:
    buffer = io.BytesIO()
    draw(report).savefig(buffer, format="png")
    return buffer.getvalue()
