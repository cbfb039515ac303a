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
                              ("/market", "market", "[data-chart] .uplot"),
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
    box = chart.bounding_box()
    assert box is not None and box["width"] > 300 and box["height"] > 50  # drawn, not collapsed
    tab.screenshot("job-gpu")
    tab.goto(f"/jobs/{dashboard.jobs['alpha_done']}")
    assert "Not measured" in tab.page.inner_text(".gpu-unmeasured")
