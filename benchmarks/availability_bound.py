"""How close to the omniscient optimum can a policy get that knows only the availability statistics?

    python benchmarks/availability_bound.py [--traces DIR] [--starts 60] [--seed 0] [--max-age 30] [--window-days D]

The omniscient optimum knows every future tick. An online policy knows the past, at best the
statistics of how long capacity lasts and how long outages last. This benchmark gives a policy those
statistics in hindsight, fitted on the whole trace, and lets it act optimally on them: a semi-Markov
model of "some zone can take the gang" (up or down, and for how long so far; the chance of going on
at each age is the trace's own), solved exactly by dynamic programming over (work left, slack,
location, restart steps left, availability state) at the trace's mean spot and on-demand prices.
It then runs through the same simulator as every policy, on the same starts as
``benchmarks/simulate.py``'s multi-zone part, beside ``broker`` and ``optimal``.

What it measures is how much of the gap to the optimum is information no availability history can
give: which run will last and which outage will be short. It is not a proof for every policy (one
could read prices, each zone apart or the time of day), but it knows the run-length statistics
better than any policy learning them online can. The 3-zone traces only: on the 9-zone trace some
zone can take a 1-node gang almost always, so the model has nothing to say there.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from simulate import DEFAULT_TRACES, job_for

from broker.sim.market import Market, SimJob, Ticks, simulate
from broker.sim.runs import random_starts, run_policy
from policies.history import GangSeries, ended_within
from policies.selection import IDLE as IDLE_KIND
from policies.selection import Budget, Location, Plan, SelectionRequest, eligible_offers, on_demand_plan, spot_ok
from providers.trace import read_trace

TRACES = (("aws-v100-2023-16node-3zones.csv.gz", 16), ("aws-v100-2023-4node-3zones.csv.gz", 4))
IDLE, SPOT, ON_DEMAND = 0, 1, 2
UNREACHABLE = 1e12


def go_on(lengths: np.ndarray, cap: int) -> np.ndarray:
    """P(a spell that has lasted a ticks lasts one more), a = 1..cap; at ``cap`` the tail's mean rate."""
    out = np.zeros(cap)
    for a in range(1, cap):
        alive = int((lengths >= a).sum())
        out[a - 1] = (lengths >= a + 1).sum() / alive if alive else 0.0
    tail = lengths[lengths >= cap]
    out[cap - 1] = 1 - len(tail) / max(float((tail - cap + 1).sum()), 1.0) if len(tail) else 0.0
    return out


def availability_chain(up_lengths: np.ndarray, down_lengths: np.ndarray, cap: int) -> np.ndarray:
    """Transition matrix over 2 x cap states: up for 1..cap ticks, then down for 1..cap ticks."""
    stay_up, stay_down = go_on(up_lengths, cap), go_on(down_lengths, cap)
    chain = np.zeros((2 * cap, 2 * cap))
    for a in range(cap):
        nxt = min(a + 1, cap - 1)
        chain[a, nxt] += stay_up[a]
        chain[a, cap] += 1 - stay_up[a]
        chain[cap + a, cap + nxt] += stay_down[a]
        chain[cap + a, 0] += 1 - stay_down[a]
    return chain


def solve(chain: np.ndarray, ticks: Ticks, spot: float, on_demand: float) -> np.ndarray:
    """The cost-minimising action per (time left, slack, location state, availability state).

    Location states: 0 idle, 1 + r on spot and 2 + k + r on on-demand with r restart steps still to
    pay. Each step either makes progress (work left falls) or not (slack falls), so the value of
    time left T needs only that of T - 1."""
    k, slack_max = ticks.overhead, ticks.deadline - ticks.work
    states, cap2 = 2 * k + 3, len(chain)
    up = np.arange(cap2) < cap2 // 2
    act = np.zeros((ticks.deadline + 1, slack_max + 1, states, cap2), dtype=np.int8)
    value = np.full((slack_max + 1, states, cap2), UNREACHABLE)
    value[0] = 0.0  # time left 0 and slack 0: the work is done
    slacks = np.arange(slack_max + 1)
    for left in range(1, ticks.deadline + 1):
        ahead = value @ chain.T  # expected value of each next state, over the next availability
        moved = ahead  # progress: same slack, one step of work less
        stalled = np.concatenate([np.full((1, states, cap2), UNREACHABLE), ahead[:-1]])  # slack - 1
        new = np.empty_like(value)
        for state in range(states):
            on_spot, on_od = 1 <= state <= k + 1, state >= k + 2
            r = state - 1 if on_spot else state - k - 2
            idle = stalled[:, 0]
            od = on_demand + (moved[:, k + 2] if on_od and r == 0 else
                              stalled[:, k + 1 + r] if on_od else
                              stalled[:, k + 1 + k] if k else moved[:, k + 2])
            sp = spot + (moved[:, 1] if on_spot and r == 0 else
                         stalled[:, r] if on_spot else
                         stalled[:, k] if k else moved[:, 1])
            sp = np.where(up, sp, UNREACHABLE)
            best = np.minimum(np.minimum(idle, sp), od)
            choice = np.where(best == idle, IDLE, np.where(best == sp, SPOT, ON_DEMAND))
            if on_spot:  # capacity gone: preempted, the step is idle
                best, choice = np.where(up, best, idle), np.where(up, choice, IDLE)
            new[:, state], act[left, :, state] = best, choice
        new[slacks == left] = 0.0
        new[slacks > left] = UNREACHABLE
        value = new
    return act


def some_zone(market: Market) -> GangSeries:
    """Capacity facts of one pseudo-zone that is up whenever some zone can take the gang."""
    return GangSeries.build(market.up.any(axis=1, keepdims=True).astype(np.int64), 1)


def informed_policy(market: Market, job: SimJob, spells: GangSeries, act: np.ndarray,
                    cap: int) -> Callable[[SelectionRequest], Plan]:
    """A selection policy that follows the solved actions, in the availability state ``spells`` gives."""
    ticks = Ticks.of(job, market.tick_seconds)
    k, slack_max = ticks.overhead, ticks.deadline - ticks.work
    any_up, ages = spells.up[:, 0], spells.age[:, 0]

    def decide(request: SelectionRequest) -> Plan:
        assert request.history is not None
        now = request.history.now
        budget = Budget.of(request)
        slack = min(max(budget.slack, 0), slack_max)
        kind = request.current.kind
        r = budget.overhead_left
        state = 0 if kind == IDLE_KIND else (1 + r if kind == "spot" else k + 2 + r)
        age = min(int(ages[now]), cap) - 1
        action = act[min(budget.work + slack, ticks.deadline), slack, state, age if any_up[now] else cap + age]
        if action == ON_DEMAND:
            return on_demand_plan(request, "the model says on-demand")
        up = [o for o in eligible_offers(request) if spot_ok(o, job.num_nodes)]
        if action == IDLE or not up:
            return Plan((), reason="the model says wait")
        here = request.current.offer
        up.sort(key=lambda o: (o is not here, o.spot_price, o.location))
        return Plan(tuple(Location("spot", o) for o in up), reason="the model says spot")

    return decide


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--traces", type=Path, default=DEFAULT_TRACES)
    parser.add_argument("--starts", type=int, default=60)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--max-age", type=int, default=30, help="ages beyond this share one state")
    parser.add_argument("--window-days", type=float, default=None,
                        help="fit each start's model on the days before it instead (an online policy's view)")
    args = parser.parse_args()
    fitted = ("the whole trace's" if args.window_days is None
              else f"the {args.window_days:g} days before its start's")
    print(f"policy that knows {fitted} run and outage statistics (not the path), acting optimally "
          f"on them; {args.starts} starts, seed {args.seed}, the multi-zone job of benchmarks/simulate.py")
    print(f"{'trace':38s} {'optimal $':>10s} {'informed':>9s} {'broker':>7s} {'deadlines':>9s} {'solve s':>8s}")
    for name, nodes in TRACES:
        market = Market(read_trace(args.traces / name), nodes)
        job = job_for(nodes)
        starts = random_starts(market, job, args.starts, args.seed)
        optimal = float(np.mean([r.cost for r in run_policy(market, job, "optimal", starts)]))
        broker = float(np.mean([r.cost for r in run_policy(market, job, "broker", starts)]))
        ticks = Ticks.of(job, market.tick_seconds)
        spells = some_zone(market)
        prices = float(market.spot_price.mean()), float(market.on_demand_min.mean())
        clock = time.perf_counter()
        whole = solve(availability_chain(spells.run_length[0], spells.down_length[0], args.max_age), ticks, *prices)
        solved = time.perf_counter() - clock
        runs = []
        for start in starts:
            act = whole
            if args.window_days is not None:
                window = round(args.window_days * 86400 / market.tick_seconds)
                up_lengths = ended_within(spells.run_end[0], spells.run_length[0], start, window)
                down_lengths = ended_within(spells.down_end[0], spells.down_length[0], start, window)
                act = solve(availability_chain(up_lengths, down_lengths, args.max_age), ticks, *prices)
            policy = informed_policy(market, job, spells, act, args.max_age)
            runs.append(simulate(market, job, policy, start, "informed"))
        informed = float(np.mean([r.cost for r in runs]))
        met = float(np.mean([r.deadline_met for r in runs]))
        print(f"{name:38s} {optimal:10.2f} {informed / optimal:8.3f}x {broker / optimal:6.3f}x "
              f"{met:9.0%} {solved:8.1f}")


if __name__ == "__main__":
    main()
