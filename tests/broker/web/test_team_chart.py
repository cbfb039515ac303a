"""The teams page's usage chart: GPUs held per team over time against the share owed, computed from the
store and drawn by the server; in real headless Chromium for the page."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from broker.config.teams import FairShareConfig
from broker.store import open_store
from broker.store.tables import AllocationRow, ClusterRow, JobRow
from broker.web.team_chart import STEP, load_usage, usage_svg
from policies.fair_share import Team
from tests.broker.web.conftest import Dashboard, Tab

NOW = datetime(2026, 3, 2, 12, 0, tzinfo=UTC)


def _job(job_id: str, team: str, gpus: int, created: datetime, started: datetime | None) -> JobRow:
    return JobRow(id=job_id, name=job_id, team=team, state="RUNNING" if started else "PENDING", priority=500,
                  spec={}, backend="local", num_nodes=1, gpus_per_node=gpus, checkpoint_dir="/c", created_at=created,
                  updated_at=created, started_at=started, zones=[])


def test_held_and_owed_follow_the_allocations_and_the_waiting_jobs(db_url: str) -> None:
    store = open_store(db_url)
    two_hours_ago, one_hour_ago = NOW - timedelta(hours=2), NOW - timedelta(hours=1)
    with store.transaction() as s:
        s.add(ClusterRow(id="c1", launch_key="c1", backend="local", cloud="local", region="r", zone="z",
                         instance_type="t", accelerator="A100", gpus_per_node=4, num_nodes=1, spot=True,
                         price_per_node_hour=1.0, on_demand_price_per_node_hour=2.0, state="UP", handle={},
                         created_at=two_hours_ago))
        s.add(_job("a1", "a", 4, two_hours_ago, two_hours_ago))
        s.add(_job("b1", "b", 2, one_hour_ago, None))  # waits from an hour ago
        s.flush()
        s.add(AllocationRow(job_id="a1", cluster_id="c1", attempt=1, gpus={"0": [0, 1, 2, 3]},
                            started_at=two_hours_ago, running_at=two_hours_ago))
    config = FairShareConfig(teams=(Team("a"), Team("b")), capacity_gpus=4)
    with store.transaction() as s:
        series = load_usage(s, config, NOW)
    store.dispose()
    assert series.times[0] == two_hours_ago and series.times[-1] == NOW
    assert series.times[1] - series.times[0] == STEP
    before, after = series.times.index(one_hour_ago - STEP), series.times.index(NOW)
    assert series.held["a"][before] == series.held["a"][after] == 4
    assert series.owed["a"][before] == 4 and series.owed.get("b", [0.0] * len(series.times))[before] == 0
    assert series.owed["a"][after] == series.owed["b"][after] == 2  # b waits: the fleet is divided in two
    assert "b" not in series.held  # b never held a GPU
    svg = usage_svg(series, ["a", "b"])
    assert svg.count('class="team-held"') == 1 and svg.count('class="team-owed"') == 2
    assert 'data-team="b"' in svg and "latest 2, peak 4" in svg  # a's owed line: 4 first, 2 now
    only_b = usage_svg(series, ["b"])
    assert 'data-team="a"' not in only_b and only_b.count('class="team-owed"') == 1
    assert "No GPUs held" in usage_svg(series, ["c"])


def test_a_hostile_team_name_is_escaped_in_the_chart() -> None:
    from broker.web.team_chart import TeamSeries

    hostile = "<script>alert(1)</script>"
    series = TeamSeries([NOW - STEP, NOW], {hostile: [1.0, 2.0]}, {hostile: [2.0, 2.0]})
    svg = usage_svg(series, [hostile])
    assert hostile not in svg and "&lt;script&gt;" in svg


@pytest.mark.slow
@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_the_teams_page_draws_each_team_s_gpus_held_against_its_share(dashboard: Dashboard, tab: Tab) -> None:
    tab.sign_in(dashboard.tokens["admin"])
    tab.goto("/teams")
    chart = tab.page.locator("svg.team-usage")
    chart.wait_for()
    held = chart.locator("polyline.team-held")
    teams = sorted(held.evaluate_all("lines => lines.map(l => l.dataset.team)"))
    assert teams == ["alpha", "beta"]  # the seeded fleet's running jobs
    assert chart.locator('polyline.team-held[data-team="alpha"] title').text_content().startswith(
        "team alpha: GPUs held, latest 4")
    assert chart.locator('polyline.team-owed[data-team="beta"]').get_attribute("stroke-dasharray") == "5 3"
    box = chart.bounding_box()
    assert box is not None and box["width"] > 300 and box["height"] > 50  # drawn, not collapsed
    assert "solid: GPUs held" in tab.page.inner_text("p.legend")
    assert tab.errors == []
    tab.screenshot("teams-usage")
    tab.sign_in(dashboard.tokens["beta"])
    tab.goto("/teams")
    lines = tab.page.locator("svg.team-usage polyline").evaluate_all("lines => lines.map(l => l.dataset.team)")
    assert set(lines) == {"beta"}
