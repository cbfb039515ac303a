"""Run named policies over many starts of one market and summarise them (what the CLI prints)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from broker.sim.market import Market, RunResult, SimJob, Ticks, replay, simulate
from policies import kinds
from policies.optimal import Problem, solve

OPTIMAL = "optimal"
MEAN_FIELDS = ("cost", "cost_vs_on_demand", "spot_hours", "on_demand_hours", "preemptions", "migrations",
               "finish_hours")


def is_single_zone(name: str) -> bool:
    return bool(getattr(kinds.selection.get(name), "single_zone", False))


def optimal_run(market: Market, job: SimJob, start: int, zone: str | None = None) -> RunResult:
    """Solve the omniscient DP for one start and replay its schedule through the same accounting."""
    ticks = Ticks.of(job, market.tick_seconds)
    span = np.arange(start, start + ticks.deadline).clip(max=market.num_ticks - 1)
    node_hours = job.num_nodes * market.tick_seconds / 3600.0
    problem = Problem(
        up=market.up[span], spot_cost=market.spot_price[span] * node_hours,
        on_demand_cost=market.on_demand_min[np.arange(start, start + max(ticks.deadline, ticks.work + ticks.overhead))
                                            .clip(max=market.num_ticks - 1)] * node_hours,
        region=market.region_of, work=ticks.work, deadline=ticks.deadline, overhead=ticks.overhead,
        egress=job.egress_cost,
    )
    return replay(market, job, solve(problem).schedule, start, name=OPTIMAL, zone=zone)


def run_policy(market: Market, job: SimJob, name: str, starts: Sequence[int]) -> list[RunResult]:
    """Every start of one policy; single-zone policies run once per zone, in the zone's own market."""
    markets: list[tuple[Market, str | None]] = [(market, None)]
    if name != OPTIMAL and is_single_zone(name):
        markets = [(market.zone(z), market.labels[z]) for z in range(len(market.labels))]
    results: list[RunResult] = []
    for where, zone in markets:
        if name == OPTIMAL:
            results.extend(optimal_run(where, job, s, zone) for s in starts)
            continue
        policy: Callable = kinds.selection.get(name)
        results.extend(simulate(where, job, policy, s, name=name, zone=zone) for s in starts)
    return results


@dataclass(frozen=True)
class Summary:
    policy: str
    runs: list[RunResult]
    mean: dict[str, float]


def summarise(name: str, runs: list[RunResult], optimal_cost: float | None = None) -> Summary:
    mean = {f: float(np.mean([getattr(r, f) for r in runs])) for f in MEAN_FIELDS}
    mean["deadline_met"] = float(np.mean([r.deadline_met for r in runs]))
    if optimal_cost is not None:
        mean["cost_vs_optimal"] = mean["cost"] / optimal_cost if optimal_cost > 0 else float("nan")
    return Summary(name, runs, mean)


def run_all(market: Market, job: SimJob, names: Sequence[str], starts: Sequence[int]) -> dict[str, Summary]:
    """Every policy over the same starts; ``cost_vs_optimal`` when ``optimal`` is among them."""
    runs = {name: run_policy(market, job, name, starts) for name in names}
    optimal_cost = float(np.mean([r.cost for r in runs[OPTIMAL]])) if OPTIMAL in runs else None
    return {name: summarise(name, found, optimal_cost) for name, found in runs.items()}


def random_starts(market: Market, job: SimJob, count: int, seed: int) -> list[int]:
    """``count`` start ticks whose deadline falls inside the trace, drawn without replacement if possible."""
    latest = market.latest_start(job)
    if latest < 0:
        raise ValueError("the trace is shorter than the job's deadline")
    rng = np.random.default_rng(seed)
    picks = rng.choice(latest + 1, size=count, replace=count > latest + 1)
    return sorted(int(s) for s in picks)
