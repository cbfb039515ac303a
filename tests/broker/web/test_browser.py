"""The dashboard in real headless Chromium: sign-in, team isolation, every page without console errors.

Each page's screenshot is saved (in the temporary directory's broker-screenshots/, or where
BROKER_SCREENSHOT_DIR says: docs/screenshots/ refreshes the ones the README shows).
"""

from __future__ import annotations

import pytest

from tests.broker.web.conftest import Dashboard, Tab

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_sign_in_with_a_token_and_refusal_of_a_wrong_one(dashboard: Dashboard, tab: Tab) -> None:
    tab.goto("/jobs")
    assert tab.page.url.endswith("/login")
    tab.sign_in("bkr_not-a-token")
    assert tab.page.url.endswith("/login")
    assert "unknown or revoked token" in tab.page.inner_text("[role=alert]")
    assert tab.context.cookies() == []
    tab.screenshot("sign-in-refused")
    tab.sign_in(dashboard.tokens["alpha"])
    assert tab.page.url == dashboard.url + "/"
    assert "team alpha" in tab.page.inner_text("nav")
    [cookie] = tab.context.cookies()
    assert cookie["httpOnly"] and tab.page.evaluate("document.cookie") == ""
    tab.page.click("nav button")
    tab.page.wait_for_url("**/login")
    tab.goto("/")
    assert tab.page.url.endswith("/login")


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_team_a_never_sees_team_b_job_also_by_url(dashboard: Dashboard, tab: Tab) -> None:
    tab.sign_in(dashboard.tokens["alpha"])
    tab.goto("/jobs")
    rows = tab.page.locator("#job-rows tr[data-job]")
    assert sorted(rows.evaluate_all("rs => rs.map(r => r.dataset.job)")) == ["j-alpha-done", "j-alpha-run"]
    response = tab.goto(f"/jobs/{dashboard.jobs['beta']}")
    assert response.status == 404 and "secret-beta-model" not in tab.page.content()
    tab.goto("/clusters")
    assert tab.page.locator("[data-cluster=c-azure]").count() == 0
    tab.goto("/jobs?team=beta")
    assert tab.page.locator("#job-rows tr[data-job=j-beta-run]").count() == 0


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_every_page_renders_without_console_errors(dashboard: Dashboard, tab: Tab) -> None:
    tab.sign_in(dashboard.tokens["admin"])
    for path, name, ready in [("/", "overview", "[data-chart] .uplot"),
                              ("/jobs", "jobs", "#job-rows tr[data-job]"),
                              (f"/jobs/{dashboard.jobs['alpha']}", "job", "svg.timeline .marker.migration"),
                              ("/clusters", "clusters", "[data-cluster=c-aws] .nvgroup"),
                              ("/market", "market", "table.market tr[data-gpu]"),
                              ("/market/gpu/A100", "market-gpu", "[data-chart] .uplot"),
                              ("/simulate", "simulate", "form.simulate")]:
        response = tab.goto(path)
        assert response.status == 200, path
        tab.page.wait_for_selector(ready, state="attached", timeout=15_000)
        tab.page.wait_for_timeout(300)
        tab.screenshot(name)
        assert tab.errors == [], f"{path}: {tab.errors}"


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_the_job_page_charts_each_gpu_s_measured_utilisation_with_the_job_s_moments(dashboard: Dashboard,
                                                                                    tab: Tab) -> None:
    from datetime import timedelta

    from broker.store.tables import CheckpointReportRow
    from tests.broker.web.seed import DAY0

    written = DAY0 + timedelta(days=1, hours=2, minutes=1)  # the checkpoint before its migration
    with dashboard.store.transaction() as s:
        s.add(CheckpointReportRow(job_id=dashboard.jobs["alpha"], cluster_id="c-gcp", node="0", path="step-900",
                                  step=900, written_at=written, received_at=written))
    tab.sign_in(dashboard.tokens["alpha"])
    tab.goto(f"/jobs/{dashboard.jobs['alpha']}")
    chart = tab.page.locator("svg.gpu-chart")
    chart.wait_for()
    lines = chart.locator("polyline.gpu-util")
    assert lines.count() == 8  # 4 GPUs in each of 2 attempts
    idle = chart.locator('polyline.gpu-util[data-attempt="2"][data-gpu="3"] title')
    assert idle.text_content() == "attempt 2, node 0, GPU 3: mean 2%"
    assert chart.locator(".marker.attempt").count() == 2 and chart.locator(".marker.notice").count() == 1
    assert chart.locator(".marker.migration").count() >= 1
    assert chart.locator(".marker.checkpoint").count() == 1
    assert (chart.locator(".marker.checkpoint title").text_content() or "").startswith("checkpoint")
    box = chart.bounding_box()
    assert box is not None and box["width"] > 300 and box["height"] > 50  # drawn, not collapsed
    tab.screenshot("job-gpu")
    tab.goto(f"/jobs/{dashboard.jobs['alpha_done']}")
    assert "Not measured" in tab.page.inner_text(".gpu-unmeasured")


def _legend(tab: Tab) -> list[str]:
    texts: list[str] = tab.page.locator(".u-legend .u-series").evaluate_all(
        "rows => rows.map(r => r.innerText.trim())")
    return texts


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_market_with_a_filled_price_book_is_small_paginated_sortable_and_its_charts_have_legends(
        dashboard: Dashboard, tab: Tab) -> None:
    from tests.broker.web.seed import GPU_TYPES, fill_price_book

    fill_price_book(dashboard.store, 5000)
    tab.sign_in(dashboard.tokens["admin"])
    response = tab.goto("/market")
    assert response.status == 200 and len(response.body()) < 500_000
    rows = tab.page.locator("table.market tr[data-gpu]")
    assert rows.count() == len(GPU_TYPES)  # one row per GPU type, never one per offer
    assert "x0" not in tab.page.inner_text("table.market")  # CPU-only offers are apart
    spot = rows.evaluate_all("rs => rs.map(r => parseFloat(r.cells[1].innerText.replace('$', '')))")
    assert spot == sorted(spot)  # cheapest first
    tab.page.click("table.market th a:has-text('GPU type')")
    tab.page.wait_for_url("**sort=gpu**")
    names = tab.page.locator("table.market tr[data-gpu]").evaluate_all("rs => rs.map(r => r.dataset.gpu)")
    assert names == sorted(names, key=str.lower)
    tab.page.select_option("select[name=cloud]", "gcp")
    tab.page.click("form.filters button")
    tab.page.wait_for_url("**cloud=gcp**")
    wheres = tab.page.locator("table.market tr[data-gpu] td:nth-child(3)").all_inner_texts()
    assert wheres and all(w.startswith("gcp/") for w in wheres)
    height = tab.page.evaluate("document.documentElement.scrollHeight")
    assert height < 5000, height
    tab.screenshot("market-filled")  # full page: it fits
    tab.goto("/market?kind=cpu")
    assert tab.page.locator("table.market.cpu tbody tr").count() == 50  # 500 CPU-only offers, a page of 50
    assert "page 1 of 10" in tab.page.inner_text(".pager")
    tab.page.click("a[rel=next]")
    tab.page.wait_for_url("**page=2**")
    assert "page 2 of 10" in tab.page.inner_text(".pager")
    tab.goto("/market/gpu/H100")
    tab.page.wait_for_selector("[data-chart] .uplot", state="attached", timeout=15_000)
    caption = tab.page.inner_text("figcaption")
    assert caption.startswith("H100: spot price in its 5 cheapest zone(s)")
    legend = _legend(tab)
    assert len(legend) == 6 and all("--" not in entry and "$" in entry for entry in legend), legend
    assert tab.errors == []


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_the_overview_chart_has_a_bar_per_day_and_a_legend_with_values(dashboard: Dashboard, tab: Tab) -> None:
    tab.sign_in(dashboard.tokens["admin"])
    tab.goto("/?since=7d")
    tab.page.wait_for_selector("[data-chart] .uplot", state="attached", timeout=15_000)
    legend = _legend(tab)
    assert any(entry.startswith("aws spend ($") for entry in legend), legend
    assert any(entry.startswith("on-demand equivalent ($") for entry in legend)
    assert all("--" not in entry for entry in legend)
    # The x axis spans whole days: half a day either side of the first and last day's bar (centred at noon).
    span = tab.page.evaluate("""() => { const el = document.querySelector('[data-chart]');
        const spec = JSON.parse(el.dataset.chart), x = el.uplot.scales.x;
        return [x.min, x.max, spec.x[0], spec.x[spec.x.length - 1], spec.x.length]; }""")
    low, high, first, last, days = span
    assert (low, high) == (first - 43200, last + 43200) and first % 86400 == 43200 and days == 8, span
    gpu = tab.page.inner_text("[data-group=gpu]")
    assert "A100" in gpu
    assert tab.errors == []


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_the_jobs_list_and_the_job_page_show_the_same_progress_and_label_their_times(dashboard: Dashboard,
                                                                                    tab: Tab) -> None:
    from datetime import timedelta

    from broker.store.tables import ProgressRow
    from tests.broker.web.seed import NOW

    job = dashboard.jobs["alpha"]
    with dashboard.store.transaction() as s:
        s.add(ProgressRow(job_id=job, attempt=2, step=1141, total=3000, at=NOW - timedelta(minutes=1)))
    tab.sign_in(dashboard.tokens["alpha"])
    tab.goto("/jobs")
    listed = tab.page.inner_text(f"#job-rows tr[data-job='{job}'] .job-progress").strip()
    assert listed == "1141/3000 (38%, reported)"
    assert "Times are wall-clock UTC" in tab.page.inner_text(".clock-note")
    tab.goto(f"/jobs/{job}")
    tab.page.wait_for_selector("svg.timeline", state="attached")
    assert tab.page.inner_text(".job-progress .progress").strip() == listed
    assert tab.page.locator(".timeline-legend .legend-item[data-state]").count() == 5  # the states it went through
    assert tab.page.locator("svg.timeline .price-axis").count() == 3
    tab.screenshot("job-progress")
    assert tab.errors == []
