from __future__ import annotations

import csv
import io
from datetime import timedelta

import pytest
from PIL import Image

from broker.reports.build import Window, build_report
from broker.reports.charts import CLOUD_COLOURS, daily_spend_png, draw, window_days
from broker.reports.render import render_csv, render_html, render_text
from broker.store import Store
from tests.broker.reports.ledger import DEMO_START, LedgerWriter

WINDOW = Window(DEMO_START, DEMO_START + timedelta(days=4))


def test_csv_has_a_total_row_and_every_group(sqlite_demo: tuple[Store, LedgerWriter]) -> None:
    store, _ = sqlite_demo
    report = build_report(store, WINDOW)
    rows = list(csv.DictReader(io.StringIO(render_csv(report))))
    total = rows[0]
    assert total["group"] == "total" and float(total["spend"]) == pytest.approx(report.totals.spend, abs=1e-3)
    idle = sum(float(total[f"idle_{c}_gpu_hours"]) for c in ("provisioning", "restarting", "waiting",
                                                             "unallocated", "finished"))
    assert idle == pytest.approx(float(total["gpu_hours"]) - float(total["useful_gpu_hours"]), abs=1e-3)
    jobs = [r for r in rows if r["group"] == "job"]
    assert {r["key"] for r in jobs} == {"j-llm", "j-vit", "j-eval", "j-seg", "(idle)"}


def test_html_escapes_names_and_references_the_chart(sqlite_demo: tuple[Store, LedgerWriter]) -> None:
    store, writer = sqlite_demo
    writer.job("j-x", "<script>alert(1)</script>", "red&team", gpus=1)
    writer.rows.clear()
    writer.minutes("c-aws-2", DEMO_START + timedelta(days=3), 5, "job:j-x", "running", 1, "red&team")
    writer.flush()
    html = render_html(build_report(store, WINDOW), chart_cid="chart@here")
    assert "<script>" not in html and "&lt;script&gt;" in html and "red&amp;team" in html
    assert 'src="cid:chart@here"' in html
    assert "<script>" in render_text(build_report(store, WINDOW))  # plain text stays as written


def test_chart_is_a_png_with_a_point_per_day(sqlite_demo: tuple[Store, LedgerWriter]) -> None:
    store, _ = sqlite_demo
    report = build_report(store, WINDOW)
    image = Image.open(io.BytesIO(daily_spend_png(report)))
    assert image.format == "PNG" and image.size == (900, 420)
    assert len({p.day for p in report.daily}) == 3 and {p.cloud for p in report.daily} == {"aws", "gcp", "azure"}
    empty = build_report(store, Window(DEMO_START - timedelta(days=9), DEMO_START - timedelta(days=2)))
    assert Image.open(io.BytesIO(daily_spend_png(empty))).format == "PNG"


def test_chart_has_a_bar_per_cloud_and_day_and_a_legend_outside_the_plot(
        sqlite_demo: tuple[Store, LedgerWriter]) -> None:
    from matplotlib.colors import to_hex

    store, _ = sqlite_demo
    report = build_report(store, WINDOW)
    figure = draw(report)
    [axes] = figure.axes
    days = window_days(report)
    assert len(days) == 4  # the window's four UTC days, the one without spend included
    bars = axes.patches
    assert len(bars) == 3 * len(days)  # one stacked bar per cloud per day
    assert {to_hex(b.get_facecolor()).upper() for b in bars} == {c.upper() for c in CLOUD_COLOURS.values()}
    renderer = figure.canvas.get_renderer()
    legend, plot = axes.get_legend().get_window_extent(renderer), axes.get_window_extent(renderer)
    assert not legend.overlaps(plot)  # the legend covers no data
    labels = [t.get_text() for t in axes.get_legend().get_texts()]
    assert sorted(labels) == ["aws spend", "azure spend", "gcp spend", "on-demand equivalent (all clouds)"]


def test_html_for_a_file_carries_the_chart_inline(sqlite_demo: tuple[Store, LedgerWriter]) -> None:
    import base64

    store, _ = sqlite_demo
    html = render_html(build_report(store, WINDOW))
    start = html.index('src="data:image/png;base64,') + len('src="data:image/png;base64,')
    image = Image.open(io.BytesIO(base64.b64decode(html[start:html.index('"', start)])))
    assert image.format == "PNG" and image.size == (900, 420)
    assert "cid:" not in html
