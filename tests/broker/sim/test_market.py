"""The simulator's rules, one at a time, on tiny hand-made traces with answers worked out by hand.

Ticks are one hour and the gang is one node unless said otherwise, so a tick on spot at $1/h
costs $1 and the arithmetic stays readable.
"""

from __future__ import annotations

import io

import numpy as np
import pytest

from broker.sim.market import IDLE_CODE, ON_DEMAND_CODE, Market, SimJob, replay, simulate
from policies.selection import ON_DEMAND, Location, Plan, SelectionRequest
from providers.trace import COLUMNS, parse_trace
from tests.markets import make_trace

HOUR = 3600.0
A, B, C = ("us-east-1a", "us-east-1"), ("us-west-2a", "us-west-2"), ("us-east-1b", "us-east-1")


def always_first_zone(request: SelectionRequest) -> Plan:
    return Plan((Location("spot", request.offers[0]),))


def always_on_demand(request: SelectionRequest) -> Plan:
    return Plan((Location(ON_DEMAND, request.offers[0]),))


def always_wait(request: SelectionRequest) -> Plan:
    return Plan(())


def job(work_h: float, deadline_h: float, overhead_h: float = 0.0, **kwargs: float) -> SimJob:
    return SimJob(num_nodes=int(kwargs.pop("num_nodes", 1)), work_s=work_h * HOUR, deadline_s=deadline_h * HOUR,
                  restart_overhead_s=overhead_h * HOUR, **kwargs)  # type: ignore[arg-type]


def test_preemption_tick_is_free_and_the_restart_pays_overhead_again() -> None:
    market = Market(make_trace([[1], [1], [0], [1], [1], [1], [1], [1]], tick_s=3600), 1)
    run = simulate(market, job(3, 8, overhead_h=1), always_first_zone, start=0)
    # t0 restart ($1), t1 work ($1), t2 preempted ($0), t3 restart ($1), t4-t5 work ($2)
    assert run.locations.tolist() == [0, 0, IDLE_CODE, 0, 0, 0]
    assert run.cost == pytest.approx(5.0)
    assert (run.preemptions, run.migrations) == (1, 0)
    assert run.finish_hours == 6 and run.deadline_met
    assert (run.spot_hours, run.spot_work_hours) == (5, 3)


def test_restart_overhead_is_rounded_up_to_whole_ticks() -> None:
    market = Market(make_trace([[1]] * 6, tick_s=3600), 1)
    run = simulate(market, job(2, 6, overhead_h=1.5), always_first_zone, start=0)
    assert run.cost == pytest.approx(4.0)  # two restart ticks, two work ticks
    assert run.finish_hours == 4


@pytest.mark.parametrize(("available", "finish", "met"), [
    ([[1], [0], [1], [1]], 3, True),  # work 1.5 h -> 2 ticks, done at the end of tick 2
    ([[0], [0], [1], [1]], 4, False),  # deadline 3.9 h -> 3 ticks: finishing in the 4th is late
])
def test_work_rounds_up_and_deadline_rounds_down(available: list[list[int]], finish: int, met: bool) -> None:
    market = Market(make_trace(available, tick_s=3600), 1)
    run = simulate(market, job(1.5, 3.9), always_first_zone, start=0)
    assert run.finish_hours == finish and run.deadline_met is met


def test_on_demand_pays_the_lowest_on_demand_price_among_zones_at_each_tick() -> None:
    trace = make_trace([[0, 0]] * 3, on_demand=[[3, 5], [4, 2], [6, 6]], zones=(A, B), tick_s=3600)
    run = simulate(Market(trace, 1), job(3, 3), always_on_demand, start=0)
    assert run.cost == pytest.approx(3 + 2 + 6)
    assert run.on_demand_hours == 3 and run.spot_hours == 0


def test_checkpoint_egress_is_paid_when_entering_spot_in_another_region_only() -> None:
    trace = make_trace([[1, 1, 1]] * 5, zones=(A, B, C), tick_s=3600)
    market = Market(trace, 1)
    # a (first launch: free), b (other region: $1), on-demand (runs where the checkpoint is: free),
    # b again (checkpoint already there: free), c (back to us-east-1: $1)
    schedule = np.array([0, 1, ON_DEMAND_CODE, 1, 2])
    run = replay(market, job(5, 5, checkpoint_gb=50, egress_per_gb=0.02), schedule, start=0)
    assert run.cost == pytest.approx(4 * 1.0 + 3.0 + 2 * 1.0)
    assert run.migrations == 4


def test_gang_needs_capacity_for_all_its_nodes() -> None:
    trace = make_trace([[4], [3], [4], [4]], tick_s=3600)
    run = simulate(Market(trace, 4), job(2, 4, num_nodes=4), always_first_zone, start=0)
    # 4 nodes at $1: t0 work, t1 only 3 nodes (preempted), t2-t3: the second tick of work
    assert run.locations.tolist() == [0, IDLE_CODE, 0]
    assert run.cost == pytest.approx(8.0) and run.preemptions == 1


def test_missing_tick_holds_the_previous_ticks_values() -> None:
    # tick 2 is absent from the file: it repeats tick 1 (no capacity), not tick 3
    trace = make_trace([[1], [0], [1], [1]], tick_s=3600, skip=[2])
    run = simulate(Market(trace, 1), job(2, 4), always_first_zone, start=0)
    assert run.locations.tolist() == [0, IDLE_CODE, IDLE_CODE, 0]


def test_an_unfinished_job_at_the_end_of_the_trace_finishes_on_on_demand() -> None:
    trace = make_trace([[0]] * 3, tick_s=3600)
    run = simulate(Market(trace, 1), job(2, 3), always_wait, start=0)
    assert run.locations.tolist() == [IDLE_CODE] * 3 + [ON_DEMAND_CODE] * 2
    assert run.cost == pytest.approx(6.0) and not run.deadline_met


def test_the_first_possible_location_of_the_plan_is_taken_and_a_failed_launch_is_recorded() -> None:
    trace = make_trace([[0, 1], [0, 1]], zones=(A, B), tick_s=3600)
    seen: list[SelectionRequest] = []

    def a_then_b(request: SelectionRequest) -> Plan:
        seen.append(request)
        return Plan((Location("spot", request.offers[0]), Location("spot", request.offers[1])))

    run = simulate(Market(trace, 1), job(2, 2), a_then_b, start=0)
    assert run.locations.tolist() == [1, 1]
    assert len(seen[1].record["aws/us-east-1a/p3.2xlarge"].failed_launches) == 1
    assert seen[0].record == {}  # the record handed out earlier is not changed afterwards


def test_the_policy_is_not_asked_at_a_preemption_tick_and_sees_its_own_preemption() -> None:
    trace = make_trace([[1], [1], [0], [1], [1]], tick_s=3600)
    asked: list[int] = []

    def spy(request: SelectionRequest) -> Plan:
        assert request.history is not None
        asked.append(request.history.now)
        return always_first_zone(request)

    run = simulate(Market(trace, 1), job(4, 5), spy, start=0)
    assert asked == [0, 1, 3, 4]
    assert run.preemptions == 1


def test_cost_vs_on_demand_divides_by_the_whole_job_on_on_demand() -> None:
    trace = make_trace([[1]] * 4, spot=[[1]] * 4, on_demand=[[3]] * 4, tick_s=3600)
    run = simulate(Market(trace, 1), job(3, 4, overhead_h=1), always_first_zone, start=0)
    assert run.cost_vs_on_demand == pytest.approx(4.0 / 12.0)


def test_a_start_later_in_the_trace_counts_ticks_from_there() -> None:
    trace = make_trace([[0], [0], [1], [1], [1]], tick_s=3600)
    run = simulate(Market(trace, 1), job(2, 3), always_first_zone, start=2)
    assert run.start == 2 and run.finish_hours == 2 and run.deadline_met


def test_job_quantities_must_be_positive() -> None:
    with pytest.raises(ValueError, match="work_s must be positive"):
        SimJob(num_nodes=1, work_s=0, deadline_s=10)


def test_the_replayed_offers_carry_the_clouds_expected_uptime_from_the_trace() -> None:
    header = ",".join(COLUMNS) + ",estimated_uptime_s,preemption_rate\n"
    rows = ("2024-01-01T00:00:00Z,gcp,us-central1,us-central1-a,a2-highgpu-1g,A100,1,1.0,3.6,1,7200,\n"
            "2024-01-01T00:00:00Z,gcp,us-east1,us-east1-b,a2-highgpu-1g,A100,1,1.0,3.6,1,,0.5\n"
            "2024-01-01T00:00:00Z,gcp,us-west1,us-west1-a,a2-highgpu-1g,A100,1,1.0,3.6,1,,\n")
    market = Market(parse_trace(io.StringIO(header + rows)), 1)
    assert [o.prior_uptime_s for o in market.offers_at(0)] == [7200.0, 2 * 86400.0, None]
