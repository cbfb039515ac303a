"""The dashboard over HTTP: sign-in, team scoping (also by URL), hostile query strings, every page renders."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.broker.web.conftest import Dashboard

PAGES = ["/", "/jobs", "/clusters", "/market", "/simulate"]


def test_pages_send_a_signed_out_browser_to_sign_in(dashboard: Dashboard) -> None:
    for path in [*PAGES, f"/jobs/{dashboard.jobs['alpha']}"]:
        response = dashboard.client.get(path, follow_redirects=False)
        assert response.status_code == 303 and response.headers["location"] == "/login", path
    assert dashboard.client.get("/jobs/rows", headers={"HX-Request": "true"}).status_code == 401


@pytest.mark.parametrize("token", ["wrong", "", "bkr_" + "x" * 5000, "bkr_\x00abc", "\udcff"])
def test_a_wrong_token_is_refused_and_sets_no_cookie(dashboard: Dashboard, token: str) -> None:
    response = dashboard.client.post("/login", content=f"token={token}".encode("utf-8", "surrogateescape"),
                                     headers={"Content-Type": "application/x-www-form-urlencoded"},
                                     follow_redirects=False)
    assert response.status_code in (400, 401, 413)
    assert "set-cookie" not in response.headers
    assert "token:" in response.text


def test_a_huge_sign_in_form_is_refused(dashboard: Dashboard) -> None:
    response = dashboard.client.post("/login", content=b"token=" + b"a" * 1_000_000,
                                     headers={"Content-Type": "application/x-www-form-urlencoded"})
    assert response.status_code == 413


def test_the_token_is_kept_in_an_httponly_cookie(dashboard: Dashboard) -> None:
    response = dashboard.client.post("/login", data={"token": dashboard.tokens["alpha"]}, follow_redirects=False)
    cookie = response.headers["set-cookie"]
    assert response.status_code == 303 and "HttpOnly" in cookie and "SameSite=strict" in cookie


def test_a_team_sees_its_jobs_only_also_by_url(dashboard: Dashboard) -> None:
    alpha = dashboard.signed_in("alpha")
    listing = alpha.get("/jobs").text
    assert dashboard.jobs["alpha"] in listing and dashboard.jobs["beta"] not in listing
    assert "secret-beta-model" not in listing
    assert alpha.get(f"/jobs/{dashboard.jobs['beta']}").status_code == 404
    assert alpha.get(f"/jobs/{dashboard.jobs['beta']}/live").status_code == 404
    assert alpha.get("/jobs", params={"team": "beta"}).text.count("secret-beta-model") == 0
    for path in PAGES:
        assert "secret-beta-model" not in alpha.get(path).text and dashboard.jobs["beta"] not in alpha.get(path).text
    admin = dashboard.signed_in("admin")
    everything = admin.get("/jobs").text
    assert dashboard.jobs["alpha"] in everything and dashboard.jobs["beta"] in everything
    assert admin.get(f"/jobs/{dashboard.jobs['beta']}").status_code == 200


@pytest.mark.parametrize("params", [{"state": "SLEEPING"}, {"sort": "1;drop"}, {"order": "sideways"},
                                    {"q": "x" * 500}, {"team": "a\x00b"}])
def test_bad_job_filters_are_one_clear_400(dashboard: Dashboard, params: dict[str, str]) -> None:
    response = dashboard.signed_in("admin").get("/jobs", params=params)
    assert response.status_code == 400
    field = next(iter(params))
    # The page names the field; a NUL byte is refused before the page by the service's request limits.
    assert f"{field}:" in response.text or f"query parameter '{field}'" in response.text


@pytest.mark.parametrize("params", [{"since": "forever"}, {"from": "yesterday"}, {"since": "1d", "from": "2026-01-01"},
                                    {"since": "9" * 400}, {"to": "2026\x00"}])
def test_bad_windows_are_one_clear_400(dashboard: Dashboard, params: dict[str, str]) -> None:
    response = dashboard.signed_in("alpha").get("/", params=params)
    field = next(iter(params))
    # The page shows its own error; a NUL byte is refused before the page by the service's request limits.
    assert response.status_code == 400
    assert 'class="error"' in response.text or f"query parameter '{field}'" in response.text


def test_jobs_sort_and_filter(dashboard: Dashboard) -> None:
    admin = dashboard.signed_in("admin")
    by_cost = admin.get("/jobs", params={"sort": "cost", "order": "desc"}).text
    assert by_cost.index("j-alpha-run") < by_cost.index("j-beta-run") < by_cost.index("j-alpha-done")
    running = admin.get("/jobs", params={"state": "running"}).text
    assert "j-alpha-done" not in running and "j-alpha-run" in running
    named = admin.get("/jobs", params={"q": "EVAL"}).text
    assert "j-alpha-done" in named and "j-alpha-run\"" not in named


def test_job_page_shows_timeline_ledger_and_markers(dashboard: Dashboard) -> None:
    html = dashboard.signed_in("alpha").get(f"/jobs/{dashboard.jobs['alpha']}").text
    assert 'class="marker notice"' in html and 'class="marker migration"' in html
    assert 'data-zone="us-central1-a"' in html and 'data-zone="us-east-1a"' in html
    assert 'class="price"' in html and "Ledger ($" in html and "finish at this pace" in html
    assert html.count('class="price-axis"') == 3 and "$0.00</text>" in html  # the $/h line has an axis
    assert 'class="legend timeline-legend"' in html and '<span class="legend-item" data-state="MIGRATING">' in html


def test_job_page_counts_ledger_minutes_by_seconds_billed_not_by_rows(dashboard: Dashboard) -> None:
    from datetime import timedelta

    from broker.store.tables import LedgerRow
    from tests.broker.web.seed import DAY0

    job, at = dashboard.jobs["alpha_done"], DAY0 + timedelta(days=10)
    with dashboard.store.transaction() as s:  # one minute split where another holder came: 20 s, then 10 s
        for start, seconds in ((at, 20.0), (at + timedelta(seconds=20), 10.0)):
            s.add(LedgerRow(cluster_id="c-aws", minute=start, holder=f"job:{job}", job_id=job, team="alpha",
                            usage="running", cloud="aws", region="us-east-1", zone="us-east-1a",
                            instance_type="p4d.24xlarge", accelerator="A100", nodes=1, gpus=8.0, seconds=seconds,
                            spot=True, price_per_node_hour=9.8, on_demand_price_per_node_hour=32.77,
                            cost=9.8 * seconds / 3600, on_demand_cost=32.77 * seconds / 3600))
    html = dashboard.signed_in("alpha").get(f"/jobs/{job}").text
    assert "<td>running</td><td>0.5</td>" in html, html[html.find("Ledger"):][:600]


def test_clusters_page_draws_nvlink_groups_and_marks_holders(dashboard: Dashboard) -> None:
    html = dashboard.signed_in("alpha").get("/clusters").text
    assert 'data-cluster="c-aws"' in html and 'data-cluster="c-azure"' not in html
    assert html.count('class="gpu held" title=') == 4 and html.count('class="gpu free" title=') == 4
    assert 'class="nvgroup"' in html  # p4d: eight A100s on one NVSwitch


def test_market_page_has_a_row_per_gpu_type_and_a_page_charting_its_cheapest_zones(dashboard: Dashboard) -> None:
    alpha = dashboard.signed_in("alpha")
    html = alpha.get("/market").text
    assert html.count('<tr data-gpu="A100">') == 1  # three offers, one row: the cheapest spot per GPU-hour
    assert "aws/us-east-1a" in html  # 9.8 $ a node of 8 GPUs (1.23 a GPU) beats 1.5 $ for 1 at every wobble
    assert "preemption notice" not in html  # the notice is three days old: no zone is avoided now
    assert 'href="/market/gpu/A100"' in html
    gpu = alpha.get("/market/gpu/A100").text
    assert "A100: spot price in its 3 cheapest zone(s) now" in gpu and "data-chart" in gpu
    assert "us-east-1a" in gpu and "us-central1-a" in gpu and "eastus-1" in gpu


@pytest.mark.slow
@pytest.mark.parametrize("viewer", ["alpha", "admin"])
def test_overview_figures_equal_broker_report_json_for_the_same_window(dashboard: Dashboard, db_url: str,
                                                                      viewer: str) -> None:
    import json
    import os
    import re
    import subprocess
    import sys
    from html import unescape

    from broker.reports.render import money
    from tests.broker.web.seed import DAY0, NOW

    start, end = f"{DAY0:%Y-%m-%dT%H:%M}", f"{NOW:%Y-%m-%dT%H:%M}"
    team = ["--team", "alpha"] if viewer == "alpha" else []  # the admin sees every team
    done = subprocess.run([sys.executable, "-m", "broker", "report", "--from", start, "--to", end, *team,
                           "--format", "json"], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "BROKER_DB_URL": db_url, "BROKER_HOME": str(dashboard.home)})
    assert done.returncode == 0, done.stderr
    cli = json.loads(done.stdout)
    html = dashboard.signed_in(viewer).get("/", params={"from": start, "to": end}).text
    shown = json.loads(re.search(r'<script type="application/json" id="report-json">(.*?)</script>', html,
                                 re.S).group(1).replace("<\\/", "</"))  # type: ignore[union-attr]
    cli.pop("generated_at"), shown.pop("generated_at")
    # The page carries the groupings it draws, their top rows: those equal the report's, as does the rest.
    assert set(shown["groups"]) == {"team", "cloud", "gpu"}
    for dimension, rows in shown.pop("groups").items():
        assert rows and rows == cli["groups"][dimension][:10]
    groups = cli.pop("groups")
    assert shown == cli
    assert cli["totals"]["spend"] > 0 and cli["team"] == (None if viewer == "admin" else "alpha")
    if viewer == "alpha":
        assert cli["totals"]["preemptions"] == 1
    else:  # beta's job is in the admin's figures, on top of alpha's
        assert {g["key"] for g in groups["team"]} >= {"alpha", "beta"}
    cards = dict(re.findall(r'data-figure="([a-z_]+)">([^<]*)<', html))
    totals = cli["totals"]
    assert unescape(cards["spend"]) == money(totals["spend"])
    assert unescape(cards["on_demand"]) == money(totals["on_demand"])
    assert unescape(cards["saving"]) == f"{money(totals['saving'])} ({totals['saving_pct']:.1f}%)"
    assert cards["preemptions"] == str(totals["preemptions"]) and cards["migrations"] == str(totals["migrations"])
    assert cards["idle_total_gpu_hours"] == f"{totals['idle_total_gpu_hours']:,.2f}"


def test_a_finished_measured_job_s_page_says_what_would_have_fit(dashboard: Dashboard) -> None:
    from datetime import UTC, datetime, timedelta

    from broker.store.gpu import GpuRollupRow
    from broker.store.tables import JobRow, LedgerRow

    at = datetime(2026, 1, 5, 10, tzinfo=UTC)
    with dashboard.store.transaction() as s:
        s.add(JobRow(id="j-alpha-sized", name="<b>eval</b>", team="alpha", state="SUCCEEDED", priority=500, spec={},
                     backend="local", num_nodes=1, gpus_per_node=4, accelerator="A100", checkpoint_dir="/c",
                     created_at=at, updated_at=at, finished_at=at + timedelta(minutes=10), zones=[]))
        s.flush()
        # 10 minutes of 4 GPUs at 0.16 $ a minute; measured 15 % busy, 6,000 MB at its peak of 40,960.
        s.add_all([LedgerRow(cluster_id="c-aws", minute=at + timedelta(minutes=m), holder="job:j-alpha-sized",
                             job_id="j-alpha-sized", team="alpha", usage="running", cloud="aws", region="us-east-1",
                             zone="us-east-1a", instance_type="p4d.24xlarge", accelerator="A100", nodes=1, gpus=4.0,
                             seconds=60.0, spot=True, price_per_node_hour=19.2, on_demand_price_per_node_hour=32.77,
                             cost=0.16, on_demand_cost=0.27) for m in range(10)])
        s.add(GpuRollupRow(job_id="j-alpha-sized", node="0", hour=at, gpu_minutes=40, measured_seconds=2400.0,
                           utilization_seconds=15.0 * 2400, peak_memory_mb=6000.0, memory_total_mb=40960.0,
                           peak_utilization=30.0))
    html = dashboard.signed_in("alpha").get("/jobs/j-alpha-sized").text
    # ceil(4 * 0.15 / 0.8) = 1 GPU would have done: 3/4 of the 1.60 $ saved.
    assert ('<li data-kind="fewer_gpus">its 4 GPUs were 15% busy: 1 would have been 60% busy, saving $1.20 where '
            'its work divides across fewer GPUs</li>') in html
    assert "<b>eval</b>" not in html  # the store's text is escaped
    running = dashboard.signed_in("alpha").get(f"/jobs/{dashboard.jobs['alpha']}").text
    assert 'class="gpu-chart"' in running and 'class="rightsizing"' not in running  # still running: no advice


def _status_json(dashboard: Dashboard, db_url: str, job_id: str) -> dict[str, object]:
    import json
    import os
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-m", "broker", "status", job_id, "--json"], capture_output=True, text=True,
                          timeout=300, env={**os.environ, "BROKER_DB_URL": db_url,
                                            "BROKER_HOME": str(dashboard.home)})
    assert done.returncode == 0, done.stderr
    result: dict[str, object] = json.loads(done.stdout)
    return result


def _shown_progress(html: str, job_id: str | None = None) -> str:
    import re
    from html import unescape

    scope = html[html.index(f'<tr data-job="{job_id}"'):] if job_id else html
    found = re.search(r'<span class="progress"[^>]*>(?:<progress[^>]*></progress> )?([^<]*)</span>', scope)
    assert found, scope[:2000]
    return unescape(found.group(1))


def test_status_the_jobs_list_and_the_job_page_show_one_progress(dashboard: Dashboard, db_url: str) -> None:
    from datetime import timedelta

    from broker.store.tables import ProgressRow
    from tests.broker.web.seed import NOW

    job = dashboard.jobs["alpha"]
    alpha = dashboard.signed_in("alpha")
    # No report yet: all three show the estimate from its run time against broker.work, and say so.
    before = _status_json(dashboard, db_url, job)
    assert before["progress_source"] == "estimated"
    assert _shown_progress(alpha.get("/jobs").text, job) == before["progress_text"]
    assert _shown_progress(alpha.get(f"/jobs/{job}").text) == before["progress_text"]
    # Its agent reports step 1141 of 3000: the job's own figure wins everywhere (the estimate says 74 %).
    with dashboard.store.transaction() as s:
        s.add(ProgressRow(job_id=job, attempt=2, step=200, total=3000, at=NOW - timedelta(minutes=5)))
        s.add(ProgressRow(job_id=job, attempt=2, step=1141, total=3000, at=NOW))
    after = _status_json(dashboard, db_url, job)
    assert after["progress_text"] == "1141/3000 (38%, reported)" and after["progress_share"] == 0.3803
    assert _shown_progress(alpha.get("/jobs").text, job) == after["progress_text"]
    assert _shown_progress(alpha.get(f"/jobs/{job}").text) == after["progress_text"]
    assert _shown_progress(alpha.get(f"/jobs/{job}/live").text) == after["progress_text"]


def test_jobs_list_and_job_page_carry_the_operator_s_columns_and_the_failure_reason_first(
        dashboard: Dashboard) -> None:
    from datetime import timedelta

    from broker.store.tables import JobRow
    from tests.broker.web.seed import DAY0

    with dashboard.store.transaction() as s:
        s.add(JobRow(id="j-alpha-stage", name="prep", team="alpha", state="FAILED", priority=500, spec={},
                     backend="local", num_nodes=1, gpus_per_node=1, accelerator="A100", checkpoint_dir="/c",
                     created_at=DAY0, updated_at=DAY0, finished_at=DAY0 + timedelta(minutes=42), zones=[],
                     pipeline_id="p-1234", stage=2, exit_code=3, reason="run exited 3: <script>x</script>"))
    alpha = dashboard.signed_in("alpha")
    listing = alpha.get("/jobs").text
    for head in ("preemptions / migrations", "pipeline stage", "duration"):
        assert f"<th>{head}</th>" in listing
    row = listing[listing.index('<tr data-job="j-alpha-stage"'):]
    row = row[:row.index("</tr>")]
    assert "<td>2 of p-1234</td>" in row and "<td>42 min</td>" in row and "<td>0 / 0</td>" in row
    run = listing[listing.index('<tr data-job="j-alpha-run"'):]
    assert "<td>1 / 1</td>" in run[:run.index("</tr>")]
    page = alpha.get("/jobs/j-alpha-stage").text
    body = page[page.index("<main>"):]
    assert body.index("data-reason") < body.index("State ") < body.index("svg")  # the reason comes first
    assert "FAILED (exit code 3): run exited 3: &lt;script&gt;x&lt;/script&gt;" in body and "<script>x" not in body
    assert "stage 2 of pipeline p-1234" in body


def test_clusters_show_team_uptime_and_cost_so_far(dashboard: Dashboard) -> None:
    import re
    from datetime import UTC, datetime, timedelta

    from broker.web.times import duration
    from tests.broker.web.seed import DAY0

    up_at = DAY0 + timedelta(minutes=5)  # as seeded, when this module was imported: uptime is read from then
    before = duration((datetime.now(UTC) - up_at).total_seconds())
    html = dashboard.signed_in("admin").get("/clusters").text
    after = duration((datetime.now(UTC) - up_at).total_seconds())
    rows = dict(re.findall(r'<tr data-cluster-row="([^"]+)">(.*?)</tr>', html))
    assert set(rows) == {"c-aws", "c-azure"}
    # c-aws: 9.8 $/h, 4 of 8 GPUs held (half the node) plus the other half idle, two hours a day on days 1 and 2.
    assert "<td>alpha</td>" in rows["c-aws"] and "<td data-cost>$39.20</td>" in rows["c-aws"]
    assert "<td>beta</td>" in rows["c-azure"] and "<td data-cost>$12.00</td>" in rows["c-azure"]
    uptime = re.search(r"<td data-uptime>(.*?)</td>", rows["c-aws"])
    assert uptime and uptime.group(1) in {before, after}, (uptime, before, after)  # about three days
    assert "c-azure" not in dashboard.signed_in("alpha").get("/clusters").text


def test_pages_on_a_replayed_market_show_wall_clock_times_with_the_market_s_beside(db_url: str,
                                                                                  broker_home: Path) -> None:
    from datetime import timedelta

    from fastapi.testclient import TestClient

    from broker.api.app import create_app
    from broker.clock import AcceleratedClock
    from broker.intake import Intake
    from broker.store import open_store
    from broker.tokens import create_api_token
    from tests.broker.web.seed import DAY0, seed_fleet

    store = open_store(db_url)
    try:
        seed_fleet(store)
        token = create_api_token(store, "admin").token
        # The replay began at DAY0 on the wall clock, 60x: DAY0 + 1 day of market is DAY0 + 24 min of wall.
        clock = AcceleratedClock((DAY0 - timedelta(minutes=1)).timestamp(), 60.0)
        client = TestClient(create_app(store, clock, Intake(broker_home, "local", None)))
        client.post("/login", data={"token": token})
        listing = client.get("/jobs").text
        wall = DAY0 - timedelta(minutes=1) + timedelta(seconds=60 / 60)
        assert f"{wall:%Y-%m-%d %H:%M}</time> <span class=\"market-time\" title=\"market clock\">(market " \
               f"{DAY0:%Y-%m-%d %H:%M})</span>" in listing
        assert "60× faster" in listing
        page = client.get("/jobs/j-alpha-run").text
        assert "(market " in page and "wall)" in page  # durations: market time and the wall time they took
        assert "(market " in client.get("/").text  # the Overview says when its window was on the wall clock
        # Zones avoided are judged on the market's clock: a notice 2 market hours old is over (the zone is
        # avoided for 1 h), one 10 market minutes old is not; the wall clock is months behind either.
        from broker.store.tables import NoticeRow

        with store.transaction() as s:
            s.add(NoticeRow(dedup_key="old", cluster_id="c-aws", node="node-0", kind="preemption",
                            source="metadata", received_at=clock.now() - timedelta(hours=2), detail={}))
        assert "preemption notice" not in client.get("/market").text
        with store.transaction() as s:
            s.add(NoticeRow(dedup_key="new", cluster_id="c-azure", node="node-0", kind="rebalance",
                            source="metadata", received_at=clock.now() - timedelta(minutes=10), detail={}))
        market = client.get("/market").text
        assert "rebalance notice" in market and "azure/eastus-1" in market and "(market " in market
    finally:
        store.dispose()


@pytest.mark.parametrize("params", [{"sort": "price;drop"}, {"order": "up"}, {"page": "0"}, {"page": "9" * 40},
                                    {"page": "NaN"}, {"cloud": "x" * 500}, {"gpu": "A\x01100"},
                                    {"kind": "tpu"}])
def test_bad_market_queries_are_one_clear_400(dashboard: Dashboard, params: dict[str, str]) -> None:
    response = dashboard.signed_in("admin").get("/market", params=params)
    field = next(iter(params))
    assert response.status_code == 400
    assert f"{field}:" in response.text or f"query parameter '{field}'" in response.text


def test_a_gpu_type_without_quotes_is_a_404_and_a_hostile_name_is_refused(dashboard: Dashboard) -> None:
    admin = dashboard.signed_in("admin")
    assert admin.get("/market/gpu/TPUv9").status_code == 404
    assert "no quote for &#x27;TPUv9&#x27;" in admin.get("/market/gpu/TPUv9").text
    assert admin.get("/market/gpu/" + "H" * 300).status_code == 400
    # A lone surrogate's bytes in the query: read as a replacement character, matching nothing.
    surrogate = admin.get("/market?region=%ED%A0%80")
    assert surrogate.status_code in (200, 400) and "Traceback" not in surrogate.text
    assert admin.get("/market/gpu/%3Cb%3E").status_code == 404 and "<b>" not in admin.get("/market/gpu/%3Cb%3E").text
