from __future__ import annotations

from collections import defaultdict
from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import func, select

from broker.reports.build import ReportError, Window, build_report, parse_window, period_start
from broker.reports.model import DIMENSIONS, Report
from broker.store import Store, open_store
from broker.store.tables import LedgerRow
from tests.broker.reports.ledger import DEMO_START, LedgerWriter

WINDOW = Window(DEMO_START, DEMO_START + timedelta(days=4))


def ledger_sums(store: Store, start: datetime, end: datetime) -> tuple[float, float, float]:
    with store.transaction() as s:
        cost, od, gpu_minutes = s.execute(
            select(func.sum(LedgerRow.cost), func.sum(LedgerRow.on_demand_cost), func.sum(LedgerRow.gpus))
            .where(LedgerRow.minute >= start, LedgerRow.minute < end)).one()
    return float(cost or 0), float(od or 0), float(gpu_minutes or 0) / 60


def test_totals_equal_the_ledger(demo: tuple[Store, LedgerWriter]) -> None:
    store, writer = demo
    report = build_report(store, WINDOW)
    spend, on_demand, gpu_hours = ledger_sums(store, WINDOW.start, WINDOW.end)
    t = report.totals
    assert t.spend == pytest.approx(spend) and t.spend == pytest.approx(sum(r["cost"] for r in writer.rows))
    assert t.on_demand == pytest.approx(on_demand)
    assert t.saving == pytest.approx(on_demand - spend)
    assert t.saving_pct == pytest.approx(100 * (on_demand - spend) / on_demand)
    assert t.gpu_hours == pytest.approx(gpu_hours)
    spot = sum(r["gpus"] for r in writer.rows if r["spot"]) / 60
    assert t.spot_share == pytest.approx(spot / gpu_hours)
    # Job counters come from the jobs table: 1 + 2 preemptions over the four jobs.
    assert (t.preemptions, t.migrations, t.work_lost_s, t.jobs) == (3, 3, 3900.0, 4)


def test_idle_breakdown_adds_up_to_allocated_minus_useful(demo: tuple[Store, LedgerWriter]) -> None:
    store, writer = demo
    t = build_report(store, WINDOW).totals
    useful = sum(r["gpus"] for r in writer.rows if r["usage"] == "running") / 60
    assert t.useful_gpu_hours == pytest.approx(useful)
    assert sum(t.idle_gpu_hours.values()) == pytest.approx(t.gpu_hours - useful)
    expected: dict[str, float] = defaultdict(float)
    for r in writer.rows:
        if r["usage"] != "running":
            expected[r["usage"]] += r["gpus"] / 60
    assert t.idle_gpu_hours == pytest.approx(dict(expected))
    assert set(t.idle_gpu_hours) == {"provisioning", "restarting", "waiting", "unallocated", "finished"}
    assert t.restart_gpu_hours == pytest.approx(expected["restarting"])


def test_every_grouping_sums_to_the_totals(demo: tuple[Store, LedgerWriter]) -> None:
    store, _ = demo
    report = build_report(store, WINDOW)
    for dimension in DIMENSIONS:
        groups = report.groups[dimension]
        assert sum(g.figures.spend for g in groups) == pytest.approx(report.totals.spend), dimension
        assert sum(g.figures.gpu_hours for g in groups) == pytest.approx(report.totals.gpu_hours), dimension
        assert sum(g.figures.preemptions for g in groups) == report.totals.preemptions, dimension
        spends = [g.figures.spend for g in groups]
        assert spends == sorted(spends, reverse=True)
    clouds = {g.key: g.figures for g in report.groups["cloud"]}
    assert set(clouds) == {"aws", "gcp", "azure"}
    assert clouds["aws"].spot_share < 1.0  # the on-demand A10G is there
    teams = {g.key: g.figures for g in report.groups["team"]}
    assert teams["vision"].preemptions == 2 and teams["nlp"].preemptions == 1


def test_team_filter_and_idle_rows_follow_the_cluster_owner(demo: tuple[Store, LedgerWriter]) -> None:
    store, writer = demo
    vision = build_report(store, WINDOW, team="vision")
    vision_clusters = {"c-az-1", "c-az-2"}  # launched for vision's jobs; their idle rows carry no team
    expected = sum(r["cost"] for r in writer.rows if r["cluster_id"] in vision_clusters)
    assert vision.totals.spend == pytest.approx(expected)
    assert {g.key for g in vision.groups["team"]} == {"vision"}
    nlp = build_report(store, WINDOW, team="nlp")
    assert nlp.totals.spend + vision.totals.spend == pytest.approx(build_report(store, WINDOW).totals.spend)


def test_window_is_half_open_and_daily_points_add_up(demo: tuple[Store, LedgerWriter]) -> None:
    store, writer = demo
    start, end = DEMO_START + timedelta(hours=10), DEMO_START + timedelta(hours=26)
    report = build_report(store, Window(start, end))
    expected = sum(r["cost"] for r in writer.rows if start <= r["minute"] < end)
    assert report.totals.spend == pytest.approx(expected)
    assert {p.day for p in report.daily} == {"2026-03-02", "2026-03-03"}
    assert sum(p.spend for p in report.daily) == pytest.approx(expected)
    day_two = sum(r["cost"] for r in writer.rows if r["cloud"] == "gcp" and r["minute"].date().isoformat()
                  == "2026-03-03" and r["minute"] < end)
    [point] = [p for p in report.daily if p.day == "2026-03-03" and p.cloud == "gcp"]
    assert point.spend == pytest.approx(day_two)


def test_top_wastes_name_the_place_and_its_figures(demo: tuple[Store, LedgerWriter]) -> None:
    store, writer = demo
    wastes = build_report(store, WINDOW).wastes
    assert len(wastes) == 3
    assert [w.cost for w in wastes] == sorted((w.cost for w in wastes), reverse=True)
    unallocated = sum(r["cost"] for r in writer.rows if r["usage"] == "unallocated")
    first = wastes[0]
    assert first.cause == "unallocated" and first.cost == pytest.approx(unallocated)
    # Rounded to 1e-9 as the builder does: summed in another order, 55.125 can come out either side of the cent.
    assert "c-az-1" in first.suggestion and f"${round(unallocated, 9):,.2f}" in first.suggestion
    assert "2.0 of its 8 GPUs" in first.suggestion
    assert {w.cause for w in wastes} == {"unallocated", "waiting", "restarting"}
    restart = next(w for w in wastes if w.cause == "restarting")
    assert "j-seg" in restart.suggestion and "2 preemption(s)" in restart.suggestion


def test_empty_window_is_a_report_of_zeros(tmp_path: object, db_url: str) -> None:
    store = open_store(db_url)
    report = build_report(store, WINDOW)
    store.dispose()
    assert report.totals.spend == 0 and report.totals.saving_pct == 0 and report.wastes == []
    assert all(rows == [] for rows in report.groups.values())


def test_report_round_trips_through_json(demo: tuple[Store, LedgerWriter]) -> None:
    store, _ = demo
    report = build_report(store, WINDOW)
    again = Report.from_dict(report.to_dict())
    assert again.to_dict() == report.to_dict()


@pytest.mark.parametrize(("args", "message"), [
    (("3x", None, None), "--since: expected a duration"),
    (("7d", "2026-03-01", None), "either --since or --from"),
    ((None, "yesterday", None), "--from: expected a date"),
    ((None, "2026-03-05", "2026-03-01"), "must be before"),
])
def test_bad_windows_name_the_option(args: tuple[str | None, str | None, str | None], message: str) -> None:
    with pytest.raises(ReportError, match=message):
        parse_window(*args, now=datetime(2026, 3, 10, tzinfo=UTC))


def test_windows_and_periods() -> None:
    now = datetime(2026, 3, 11, 15, 30, tzinfo=UTC)  # a Wednesday
    assert parse_window("2d", None, None, now) == Window(now - timedelta(days=2), now)
    assert parse_window(None, "2026-03-02", "2026-03-04T12:00", now) == Window(
        datetime(2026, 3, 2, tzinfo=UTC), datetime(2026, 3, 4, 12, tzinfo=UTC))
    assert period_start(now, "day") == datetime(2026, 3, 11, tzinfo=UTC)
    assert period_start(now, "week") == datetime(2026, 3, 9, tzinfo=UTC)
    assert period_start(now, "month") == datetime(2026, 3, 1, tzinfo=UTC)


def test_wastes_count_split_minutes_by_their_seconds(db_url: str) -> None:
    """Where holders change inside a minute, a minute is several ledger rows: the wastes' minutes are their seconds."""
    store = open_store(db_url)
    try:
        w = LedgerWriter(store)
        w.job("j-a", "short-runs", "nlp", gpus=8)
        w.cluster("c-1", cloud="aws", region="us-east-1", zone="us-east-1a", instance_type="p3.8xlarge",
                  accelerator="V100", gpus_per_node=8, nodes=1, price=12.0, on_demand=24.0, job_id="j-a")
        start = DEMO_START + timedelta(hours=10, minutes=50)  # part-hours from the ledger, whole ones from the roll-up
        c = w._clusters["c-1"]
        for i in range(140):  # each minute: j-a runs 30 s on 6 GPUs; then the cluster drains for 30 s
            minute = start + timedelta(minutes=i)
            for at, holder, usage, gpus in ((0, "job:j-a", "running", 6), (0, "idle:unallocated", "unallocated", 2),
                                            (30, "idle:queue_drain", "queue_drain", 8)):
                w.rows.append(dict(
                    cluster_id="c-1", minute=minute + timedelta(seconds=at), holder=holder,
                    job_id="j-a" if holder == "job:j-a" else None, team="nlp" if holder == "job:j-a" else None,
                    usage=usage, cloud=c.cloud, region=c.region, zone=c.zone, instance_type=c.instance_type,
                    accelerator=c.accelerator, nodes=1, gpus=gpus, seconds=30.0, spot=True, price_per_node_hour=12.0,
                    on_demand_price_per_node_hour=24.0, cost=12.0 * gpus / 8 * 30 / 3600,
                    on_demand_cost=24.0 * gpus / 8 * 30 / 3600))
        w.flush()
        wastes = {x.cause: x for x in build_report(store, Window(start, start + timedelta(minutes=140))).wastes}
        assert wastes.keys() == {"unallocated", "queue_drain"}
        assert wastes["queue_drain"].gpu_hours == pytest.approx(8 * 70 / 60)
        assert "its GPUs sat 70 min between one job's end" in wastes["queue_drain"].suggestion
        assert "on average 2.0 of its 8 GPUs sat unallocated for 70 min" in wastes["unallocated"].suggestion
    finally:
        store.dispose()
