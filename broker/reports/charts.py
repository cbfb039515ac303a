"""The report's chart: daily spend against its on-demand equivalent, one colour per cloud, as PNG bytes."""

from __future__ import annotations

import io
from collections import defaultdict
from datetime import date

from broker.reports.model import Report

_COLOURS = {"aws": "#ff9900", "gcp": "#4285f4", "azure": "#008ad7"}


def daily_spend_png(report: Report) -> bytes:
    # The object API with the Agg canvas: no pyplot global state, safe in the service's threads.
    import numpy as np
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    spend: dict[str, dict[date, float]] = defaultdict(dict)
    on_demand: dict[str, dict[date, float]] = defaultdict(dict)
    for point in report.daily:
        day = date.fromisoformat(point.day)
        spend[point.cloud][day] = point.spend
        on_demand[point.cloud][day] = point.on_demand
    days = sorted({d for per_day in spend.values() for d in per_day})
    x = np.array(days, dtype="datetime64[D]")

    figure = Figure(figsize=(8, 3.6), dpi=100)
    FigureCanvasAgg(figure)
    axes = figure.add_subplot()
    fallback = iter(["#6a3d9a", "#33a02c", "#e31a1c", "#b15928"])
    for cloud in sorted(spend):
        colour = _COLOURS.get(cloud) or next(fallback, "#444444")
        axes.plot(x, [spend[cloud].get(d, 0.0) for d in days], marker="o", color=colour,
                  label=f"{cloud} spend")
        axes.plot(x, [on_demand[cloud].get(d, 0.0) for d in days], linestyle="--", color=colour,
                  alpha=0.7, label=f"{cloud} on-demand equivalent")
    axes.set_title("Daily spend vs on-demand equivalent, by cloud (USD)")
    axes.set_ylabel("USD per day")
    axes.grid(alpha=0.3)
    if days:
        axes.legend(fontsize=7, ncols=2)
        figure.autofmt_xdate()
    else:
        axes.text(0.5, 0.5, "no ledger minutes in the window", ha="center", va="center",
                  transform=axes.transAxes)
    figure.tight_layout()
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png")
    return buffer.getvalue()
