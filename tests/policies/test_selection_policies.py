"""The registered selection policies: their rules on hand-made markets, deadlines, determinism."""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from broker.sim.market import Market, SimJob, simulate
from broker.sim.runs import random_starts
from policies import kinds
from policies.history import MarketHistory, MarketSeries
from policies.selection import (
    IDLE,
    ON_DEMAND,
    JobView,
    Location,
    SelectionRequest,
    ZoneOffer,
    ZoneRecord,
)
from providers.trace import MarketTrace, read_trace
from tests.markets import START, make_trace

A, B, C = ("us-east-1a", "us-east-1"), ("us-west-2a", "us-west-2"), ("us-east-1b", "us-east-1")
MINUTE = 60.0
IDLE_HERE = Location(IDLE)


def offers_at(trace: MarketTrace, tick: int) -> tuple[ZoneOffer, ...]:
    return tuple(ZoneOffer(q.cloud, q.region, q.zone, q.instance_type, q.accelerator, q.gpus_per_node,
                           float(q.spot_price or 0), float(q.on_demand_price or 0), q.available_nodes)
                 for q in trace.quotes_at(tick))


def request_at(trace: MarketTrace, tick: int, *, work_left: int, deadline: int, total_work: int | None = None,
               current: Location = IDLE_HERE, in_location: int = 0, overhead: int = 1,
               series: MarketSeries | None = None, record: dict[str, ZoneRecord] | None = None) -> SelectionRequest:
    """A request at ``tick`` for a 1-node job started at tick 0 (all counts in one-minute ticks)."""
    return SelectionRequest(
        now=trace.time_of(tick),
        job=JobView(num_nodes=1, gpus_per_node=1, accelerator="V100", remaining_work_s=work_left * MINUTE,
                    deadline=START + timedelta(minutes=deadline), restart_overhead_s=overhead * MINUTE,
                    total_work_s=(total_work or work_left) * MINUTE, started_at=START),
        offers=offers_at(trace, tick),
        current=current,
        record=record or {},
        history=MarketHistory(series or MarketSeries.from_trace(trace), tick),
        step_s=MINUTE,
        in_location_s=in_location * MINUTE,
    )


def spot(trace: MarketTrace, tick: int, zone: int) -> Location:
    return Location("spot", offers_at(trace, tick)[zone])


def test_broker_is_the_default_and_cheapest_spot_stays_registered() -> None:
    assert kinds.selection.default_name() == "broker"
    assert {"broker", "cheapest_spot", "on_demand", "greedy", "uniform_progress", "up_multi", "skypilot_eager",
            "optimal"} <= set(kinds.selection.names())


def test_greedy_waits_with_slack_and_takes_on_demand_for_good_below_two_restarts() -> None:
    trace = make_trace([[0]] * 40)
    greedy = kinds.selection.get("greedy")
    # overhead 2 ticks: the net is at slack < 2*2+1 = 5
    assert greedy(request_at(trace, 0, work_left=10, deadline=15, overhead=2)).locations == ()
    plan = greedy(request_at(trace, 1, work_left=10, deadline=15, overhead=2))
    assert plan.locations[0].kind == ON_DEMAND
    on_od = Location(ON_DEMAND, offers_at(trace, 2)[0])
    spot_back = make_trace([[1]] * 40)
    assert greedy(request_at(spot_back, 2, work_left=5, deadline=30, overhead=2, current=on_od)).locations[0].kind \
        == ON_DEMAND


def test_uniform_progress_catches_up_on_on_demand_only_when_behind() -> None:
    trace = make_trace([[0]] * 100)
    up = kinds.selection.get("uniform_progress")
    # 50 ticks of work in 100: pace 0.5 a tick, so 5 done by tick 10 is on pace, 4 is behind
    ahead = request_at(trace, 10, work_left=45, deadline=100, total_work=50)
    behind = request_at(trace, 10, work_left=46, deadline=100, total_work=50)
    assert up(ahead).locations == ()
    assert up(behind).locations[0].kind == ON_DEMAND
    # on on-demand it stays until 2 restarts (2 x 1 tick x 0.5) ahead of pace: 6 done, then waits
    on_od = Location(ON_DEMAND, offers_at(trace, 10)[0])
    assert up(request_at(trace, 10, work_left=45, deadline=100, total_work=50, current=on_od,
                         in_location=5)).locations[0].kind == ON_DEMAND
    assert up(request_at(trace, 10, work_left=44, deadline=100, total_work=50, current=on_od,
                         in_location=5)).locations == ()


def test_skypilot_eager_relaunches_in_another_region_first() -> None:
    trace = make_trace([[1, 1, 1]] * 5, spot=[[1.0, 2.0, 1.0]] * 5, zones=(A, B, C))
    eager = kinds.selection.get("skypilot_eager")
    fresh = eager(request_at(trace, 1, work_left=5, deadline=50))
    assert fresh.locations[0].offer is not None and fresh.locations[0].offer.zone == "us-east-1a"  # cheapest
    record = {"aws/us-east-1a/p3.2xlarge": ZoneRecord(preemptions=(trace.time_of(0),))}
    after = eager(request_at(trace, 1, work_left=5, deadline=50, record=record))
    assert [loc.offer.zone for loc in after.locations if loc.offer] == ["us-west-2a", "us-east-1a", "us-east-1b"]


@pytest.mark.parametrize("name", ["broker", "cheapest_spot", "skypilot_eager", "up_multi", "uniform_progress"])
def test_every_policy_keeps_a_job_to_the_places_its_file_allows(name: str) -> None:
    trace = make_trace([[1, 1, 1]] * 5, spot=[[1.0, 2.0, 1.0]] * 5, zones=(A, B, C))
    request = request_at(trace, 1, work_left=5, deadline=50)
    pinned = replace(request, job=replace(request.job, allowed_places=frozenset({("aws", "us-west-2")})))
    plan = kinds.selection.get(name)(pinned)
    assert {loc.offer.zone for loc in plan.locations if loc.offer} <= {"us-west-2a"}
    anywhere_in_aws = replace(request, job=replace(request.job, allowed_places=frozenset({("aws", None)})))
    assert any(loc.offer for loc in kinds.selection.get("cheapest_spot")(anywhere_in_aws).locations)
    elsewhere = replace(request, job=replace(request.job, allowed_places=frozenset({("gcp", None)})))
    assert not any(loc.offer for loc in kinds.selection.get(name)(elsewhere).locations)


def test_broker_leaves_spot_for_on_demand_before_a_preemption_could_break_the_deadline() -> None:
    trace = make_trace([[1]] * 30)
    broker = kinds.selection.get("broker")
    here = spot(trace, 5, 0)
    # overhead 2: on spot and working it needs slack >= 3 to survive one preemption
    assert broker(request_at(trace, 5, work_left=10, deadline=18, overhead=2, current=here,
                             in_location=4)).locations[0].kind == "spot"
    assert broker(request_at(trace, 5, work_left=10, deadline=17, overhead=2, current=here,
                             in_location=4)).locations[0].kind == ON_DEMAND


def test_broker_skips_capacity_that_tends_to_vanish_before_a_restart_pays_off() -> None:
    # zone a has come and gone in 1-tick blips all along; zone b's runs last 20 ticks
    blips = [[t % 2, 1 if (t // 20) % 2 == 0 else 0] for t in range(200)]
    trace = make_trace(blips, zones=(A, B))
    broker = kinds.selection.get("broker")
    tick = next(t for t in range(150, 200) if blips[t] == [1, 0])
    plan = broker(request_at(trace, tick, work_left=30, deadline=tick + 200, total_work=30, overhead=2))
    assert plan.locations == ()  # plenty of slack: wait for capacity worth a restart
    tick_b = next(t for t in range(150, 200) if blips[t][1] == 1 and blips[t - 3][1] == 1)
    plan = broker(request_at(trace, tick_b, work_left=30, deadline=tick_b + 200, total_work=30, overhead=2))
    assert plan.locations[0].offer is not None and plan.locations[0].offer.zone == "us-west-2a"


def test_broker_leaves_on_demand_only_once_young_capacity_has_outlived_the_blips() -> None:
    # three of every four runs last 3 ticks (as long as a restart), the fourth 40
    cycle = [1] * 3 + [0] * 4
    pattern = (cycle * 3 + [1] * 40 + [0] * 4) * 12
    trace = make_trace([[a] for a in pattern])
    broker = kinds.selection.get("broker")
    start = next(t for t in range(500, len(pattern)) if pattern[t] and not pattern[t - 1] and pattern[t + 3])
    on_demand = Location(ON_DEMAND, offers_at(trace, start)[0])

    def plan_at(age: int) -> str:
        tick = start + age
        # well ahead of pace: slack is worth nothing, so only the dollars decide
        return broker(request_at(trace, tick, work_left=200, deadline=tick + 1000, total_work=1000, overhead=3,
                                 current=on_demand, in_location=50)).locations[0].kind

    assert [plan_at(age) for age in range(3)] == [ON_DEMAND] * 3  # most runs this young die at 3
    assert plan_at(3) == "spot"  # past the blips, the long run is worth two restarts


def test_broker_waits_out_a_short_outage_when_little_work_is_left_but_not_when_much_is() -> None:
    # 10-tick runs, 3-tick outages; the job is idle at an outage's first tick with 20 ticks of slack,
    # behind an even pace (10 ticks done of work + 10)
    pattern = ([1] * 10 + [0] * 3) * 80
    trace = make_trace([[a] for a in pattern])
    broker = kinds.selection.get("broker")
    tick = next(t for t in range(600, 900) if pattern[t - 1] and not pattern[t])

    def plan_for(work: int) -> str:
        plan = broker(request_at(trace, tick, work_left=work, deadline=tick + work + 20, total_work=work + 10,
                                 overhead=2))
        return plan.locations[0].kind if plan.locations else IDLE

    # 80 ticks left: caught by the deadline floor, little would run on on-demand; waiting pays
    assert plan_for(80) == IDLE
    # 320 left: the floor would put most of it on on-demand; buy slack on on-demand now
    assert plan_for(320) == ON_DEMAND


def test_broker_slack_grows_short_gradually_below_what_spot_alone_needs() -> None:
    # 30-tick runs, 20-tick outages: spot alone is expected to spend about 0.37 x the work in slack
    # (with the margin); the job is idle at an outage's first tick, 200 ticks of work left, behind pace
    pattern = ([1] * 30 + [0] * 20) * 30
    trace = make_trace([[a] for a in pattern])
    broker = kinds.selection.get("broker")
    tick = next(t for t in range(1000, 1400) if pattern[t - 1] and not pattern[t])

    def plan_for(slack: int) -> str:
        plan = broker(request_at(trace, tick, work_left=200, deadline=tick + 200 + slack, total_work=210,
                                 overhead=2))
        return plan.locations[0].kind if plan.locations else IDLE

    assert plan_for(84) == IDLE  # covers what spot alone needs: slack to spare
    assert plan_for(76) == IDLE  # just short of it: slack is worth little yet, the outage is waited out
    assert plan_for(52) == ON_DEMAND  # well short: on-demand


def test_broker_moves_to_a_much_cheaper_zone_and_stays_for_a_small_saving() -> None:
    long_runs = [[1, 1]] * 300
    broker = kinds.selection.get("broker")
    for price_b, moves in ((0.5, True), (0.97, False)):
        trace = make_trace(long_runs, spot=[[1.0, price_b]] * 300, zones=(A, B))
        # ahead of pace (20 of 40 done with 750 of 1000 ticks left): slack to spend on a restart
        plan = broker(request_at(trace, 250, work_left=20, deadline=1000, total_work=40,
                                 current=spot(trace, 250, 0), in_location=10))
        assert plan.locations[0].offer is not None
        assert (plan.locations[0].offer.zone == "us-west-2a") is moves


def test_broker_depends_only_on_the_request() -> None:
    trace = make_trace([[int(t % 3 != 0), int(t % 5 != 0)] for t in range(120)], zones=(A, B))
    broker = kinds.selection.get("broker")
    for tick in range(60, 120, 7):
        one = broker(request_at(trace, tick, work_left=20, deadline=150, total_work=30))
        again = broker(request_at(trace, tick, work_left=20, deadline=150, total_work=30,
                                  series=MarketSeries.from_trace(trace)))
        assert one == again


def test_history_never_shows_the_future() -> None:
    rng = np.random.default_rng(7)
    available = rng.integers(0, 3, size=(80, 3)).tolist()
    trace = make_trace(available, zones=(A, B, C))
    whole = MarketSeries.from_trace(trace)
    for now in (0, 1, 17, 50, 79):
        cut = MarketSeries(whole.locations, whole.regions, whole.tick_seconds, whole.spot_price[: now + 1],
                           whole.on_demand_price[: now + 1], whole.available_nodes[: now + 1])
        seen, known = MarketHistory(whole, now), MarketHistory(cut, now)
        assert seen.age(2).tolist() == known.age(2).tolist()
        assert seen.availability(2, 10).tolist() == known.availability(2, 10).tolist()
        for z in range(3):
            assert seen.finished_up_runs(2, z, 30).tolist() == known.finished_up_runs(2, z, 30).tolist()
            assert seen.finished_down_runs(1, z, 80).tolist() == known.finished_down_runs(1, z, 80).tolist()
        assert seen.available_nodes.shape[0] == now + 1


@st.composite
def markets(draw: st.DrawFn) -> tuple[Market, SimJob]:
    ticks = draw(st.integers(20, 80))
    zones = draw(st.integers(1, 3))
    stay = draw(st.floats(0.5, 0.97))
    state = [1] * zones
    rows = []
    rng = np.random.default_rng(draw(st.integers(0, 2**31)))
    for _ in range(ticks):
        state = [s if rng.random() < stay else 1 - s for s in state]
        rows.append(list(state))
    spot = rng.choice([0.9, 1.0, 1.3], size=(ticks, zones)).tolist()
    trace = make_trace(rows, spot=spot, zones=(A, B, C)[:zones], tick_s=300)
    work = draw(st.integers(1, ticks - 5))
    overhead = draw(st.integers(0, 4))
    deadline = draw(st.integers(work + overhead, min(ticks, work + overhead + 30)))  # on-demand can make it
    job = SimJob(num_nodes=1, work_s=300 * work, deadline_s=300 * deadline,
                 restart_overhead_s=max(0, 300 * overhead - 10))
    return Market(trace, 1), job


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(markets())
def test_no_policy_misses_a_deadline_on_demand_could_meet(case: tuple[Market, SimJob]) -> None:
    market, job = case
    for name in ("broker", "greedy", "uniform_progress", "up_multi", "skypilot_eager", "on_demand"):
        assert simulate(market, job, kinds.selection.get(name), start=0).deadline_met, name


@pytest.mark.traces
def test_broker_meets_every_deadline_on_the_16_node_trace(shared_traces: Path) -> None:
    trace = read_trace(shared_traces / "aws-v100-2023-16node-3zones.csv.gz").select("V100", 1)
    market = Market(trace, 16)
    job = SimJob(num_nodes=16, work_s=48 * 3600, deadline_s=60 * 3600, restart_overhead_s=720)
    broker = kinds.selection.get("broker")
    for start in random_starts(market, job, 12, seed=3):
        run = simulate(market, job, broker, start)
        assert run.deadline_met
        assert run.cost < market.on_demand_cost(job, start)


def test_broker_launches_without_history_or_deadline() -> None:
    """What the live engine may hand it on a fresh price book: no history, no counts, no deadline."""
    offers = (ZoneOffer("aws", "us-east-1", "us-east-1a", "p3.2xlarge", "V100", 1, 1.2, 3.06, None),
              ZoneOffer("aws", "us-west-2", "us-west-2a", "p3.2xlarge", "V100", 1, 0.9, 3.06, None))
    broker = kinds.selection.get("broker")
    for work in (3600.0, None):
        plan = broker(SelectionRequest(now=START, job=JobView(1, 1, "V100", work, None), offers=offers))
        assert [loc.offer.zone for loc in plan.locations if loc.offer] == ["us-west-2a", "us-east-1a"]


def test_broker_is_picky_about_spot_only_while_the_slack_dwarfs_what_the_market_will_spend() -> None:
    # zone a is always up at half the on-demand price; zone b is a third of a's price but comes and
    # goes (10 ticks up, 10 down), so spot alone is expected to spend about 0.05 x the work in slack
    # (its restarts). The job is idle while b is down, ahead of an even pace (no slack pressure).
    ticks = 600
    pattern = [[1, 1 if (t // 10) % 2 == 0 else 0] for t in range(ticks)]
    trace = make_trace(pattern, spot=[[1.5, 0.5]] * ticks, zones=(A, B))
    broker = kinds.selection.get("broker")
    tick = next(t for t in range(300, 400) if not pattern[t][1] and pattern[t - 1][1])

    def plan_for(slack: int) -> str:
        plan = broker(request_at(trace, tick, work_left=200, deadline=tick + 200 + slack, total_work=tick + 200,
                                 overhead=2))
        return "wait" if not plan.locations else plan.locations[0].offer.zone  # type: ignore[union-attr]

    # slack many times what the market will spend: wait the few ticks for b's cheaper runs
    assert plan_for(100) == "wait"
    # slack within 4 x of it: a wait is slack the outages may need later; a beats on-demand, take it
    assert plan_for(30) == "us-east-1a"


def test_broker_under_pressure_enters_short_lived_spot_rather_than_wait_with_nothing_to_wait_out() -> None:
    # runs of 3 ticks, outages of 1, restarts of 2: spot is up three ticks in four, but each entry is
    # expected to give a tick of progress, which at the slack's worth is dearer than on-demand. The job
    # is behind an even pace with little work left, so the outage rule would wait: but spot is up,
    # there is no outage to wait out, and every tick waited is slack spent for nothing.
    pattern = ([1] * 3 + [0]) * 200
    trace = make_trace([[a] for a in pattern])
    broker = kinds.selection.get("broker")
    tick = next(t for t in range(400, 600) if pattern[t] and not pattern[t - 1])
    plan = broker(request_at(trace, tick, work_left=40, deadline=tick + 40 + 20, total_work=120, overhead=2))
    assert plan.locations and plan.locations[0].kind == "spot", plan.reason


def test_broker_prices_a_zone_by_the_clouds_expected_uptime_where_its_own_record_is_thin() -> None:
    """A fresh price book: no history. The cheaper zone's cloud says its spot VMs last 10 minutes,
    the other's 10 hours: with a 30-minute restart the cheaper zone's progress costs more."""
    def offers(short: float | None, long: float | None) -> tuple[ZoneOffer, ...]:
        return (ZoneOffer("gcp", "us-central1", "us-central1-a", "a2-highgpu-1g", "A100", 1, 1.0, 3.6, None,
                          prior_uptime_s=short),
                ZoneOffer("gcp", "us-east1", "us-east1-b", "a2-highgpu-1g", "A100", 1, 1.05, 3.6, None,
                          prior_uptime_s=long))
    broker = kinds.selection.get("broker")
    job = JobView(1, 1, "A100", 20 * 3600.0, None, restart_overhead_s=1800.0)
    plain = broker(SelectionRequest(now=START, job=job, offers=offers(None, None), step_s=MINUTE))
    told = broker(SelectionRequest(now=START, job=job, offers=offers(600.0, 36000.0), step_s=MINUTE))
    assert next(loc.offer.zone for loc in plain.locations if loc.offer) == "us-central1-a"
    assert next(loc.offer.zone for loc in told.locations if loc.offer) == "us-east1-b"


def test_broker_trusts_a_zones_own_runs_over_the_clouds_word_once_it_has_enough() -> None:
    # both zones come and go in 10-tick runs for 600 ticks: far more than MIN_RUNS runs of their own
    available = [[1 if (t // 10) % 2 == 0 else 0, 1 if (t // 10) % 2 == 0 else 0] for t in range(600)]
    trace = make_trace(available, zones=(A, B))
    tick = next(t for t in range(550, 600) if available[t][0] == 1)
    broker = kinds.selection.get("broker")
    plain = request_at(trace, tick, work_left=30, deadline=tick + 300, total_work=30, overhead=2)
    told = replace(plain, offers=tuple(replace(o, prior_uptime_s=(60.0 if o.zone == A[0] else 86400.0))
                                       for o in plain.offers))
    with_word, without = broker(told), broker(plain)
    assert [loc.label for loc in with_word.locations] == [loc.label for loc in without.locations]
    assert with_word.reason == without.reason
