"""The omniscient DP: equal to a brute force over every schedule on tiny traces, never beaten."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from broker.sim.market import Market, SimJob, replay, simulate
from broker.sim.runs import optimal_run
from policies import kinds
from policies.optimal import OmniscientOnly, Problem, solve
from policies.selection import JobView, SelectionRequest
from tests.markets import START, make_trace

ZONES = (("us-east-1a", "us-east-1"), ("us-west-2a", "us-west-2"), ("us-east-1b", "us-east-1"))


@st.composite
def tiny_markets(draw: st.DrawFn, max_ticks: int = 6, max_zones: int = 2) -> tuple[Market, SimJob]:
    ticks = draw(st.integers(3, max_ticks))
    zones = draw(st.integers(1, max_zones))
    available = [[draw(st.integers(0, 2)) for _ in range(zones)] for _ in range(ticks)]
    spot = [[draw(st.sampled_from([0.5, 1.0, 1.5])) for _ in range(zones)] for _ in range(ticks)]
    on_demand = [[draw(st.sampled_from([2.0, 3.0])) for _ in range(zones)] for _ in range(ticks)]
    trace = make_trace(available, spot=spot, on_demand=on_demand, zones=ZONES[:zones], tick_s=60)
    nodes = draw(st.integers(1, 2))
    job = SimJob(num_nodes=nodes, work_s=60 * draw(st.integers(1, 3)), deadline_s=60 * draw(st.integers(2, ticks)),
                 restart_overhead_s=60 * draw(st.integers(0, 2)), checkpoint_gb=draw(st.sampled_from([0, 50])),
                 egress_per_gb=0.01)
    return Market(trace, nodes), job


def brute_force(market: Market, job: SimJob) -> float | None:
    """The cheapest cost over every location sequence that meets the deadline (None: none does)."""
    deadline = int(job.deadline_s // market.tick_seconds)
    codes = [-1, -2, *range(len(market.labels))]
    best = None
    for schedule in itertools.product(codes, repeat=deadline):
        run = replay(market, job, np.array(schedule), start=0)
        if run.deadline_met and (best is None or run.cost < best):
            best = run.cost
    return best


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(tiny_markets(max_ticks=5))
def test_optimal_equals_brute_force(case: tuple[Market, SimJob]) -> None:
    market, job = case
    best = brute_force(market, job)
    run = optimal_run(market, job, start=0)
    if best is None:
        assert not run.deadline_met
    else:
        assert run.deadline_met
        assert run.cost == pytest.approx(best)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(tiny_markets(max_ticks=10, max_zones=3))
def test_no_policy_beats_optimal_while_meeting_the_deadline(case: tuple[Market, SimJob]) -> None:
    market, job = case
    best = optimal_run(market, job, start=0)
    for name in kinds.selection.names():
        if name == "optimal":
            continue
        run = simulate(market, job, kinds.selection.get(name), start=0, name=name)
        if run.deadline_met:
            assert best.deadline_met and best.cost <= run.cost + 1e-9, name


def test_dp_cost_is_what_the_replay_charges() -> None:
    trace = make_trace([[1, 0], [1, 1], [0, 1], [0, 1], [1, 1], [1, 0]], spot=[[1, 2]] * 6,
                       zones=ZONES[:2], tick_s=60)
    market = Market(trace, 1)
    job = SimJob(num_nodes=1, work_s=180, deadline_s=360, restart_overhead_s=60, checkpoint_gb=50,
                 egress_per_gb=0.01)
    node_hours = 60 / 3600
    problem = Problem(up=market.up, spot_cost=market.spot_price * node_hours,
                      on_demand_cost=market.on_demand_min * node_hours, region=market.region_of, work=3,
                      deadline=6, overhead=1, egress=0.5)
    solution = solve(problem)
    assert replay(market, job, solution.schedule, start=0).cost == pytest.approx(solution.cost)


def test_infeasible_deadline_runs_on_demand_at_once() -> None:
    market = Market(make_trace([[1]] * 4, tick_s=60), 1)
    job = SimJob(num_nodes=1, work_s=240, deadline_s=180, restart_overhead_s=60)
    run = optimal_run(market, job, start=0)
    assert run.locations.tolist() == [-2] * 5 and not run.deadline_met


def test_optimal_cannot_be_asked_per_step() -> None:
    request = SelectionRequest(now=START, job=JobView(1, 1, "V100", 60.0, None), offers=())
    with pytest.raises(OmniscientOnly, match="broker simulate"):
        kinds.selection.get("optimal")(request)
