from __future__ import annotations

import csv
import io
from datetime import timedelta

import pytest
from PIL import Image

from broker.reports.build import Window, build_report
from broker.reports.charts import daily_spend_png
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
    assert image.format == "PNG" and image.size == (800, 360)
    assert len({p.day for p in report.daily}) == 3 and {p.cloud for p in report.daily} == {"aws", "gcp", "azure"}
    empty = build_report(store, Window(DEMO_START - timedelta(days=9), DEMO_START - timedelta(days=2)))
    assert Image.open(io.BytesIO(daily_spend_png(empty))).format == "PNG"
