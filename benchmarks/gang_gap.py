"""Where a gang's cost above the omniscient optimum goes, and what partial spot counts say.

    python benchmarks/gang_gap.py [--traces DIR] [--starts 60] [--seed 0] [--only TRACE-SUBSTRING] [--oracle]

On the multi-zone traces, with the job of ``benchmarks/simulate.py``'s Part 2 (48 h of work, 60 h
deadline, 0.2 h restart, 50 GB checkpoint at $0.02/GB; the gang is the trace's probe size), it runs
``up_multi``, ``skypilot_eager``, ``broker`` and the omniscient ``optimal`` on the same random
starts and splits each one's mean cost into what it paid for: progress on spot, restarts on spot,
progress on on-demand, restarts on on-demand, checkpoint egress. It counts the steps spent on
on-demand while some zone could take the gang, the entries into on-demand, the steps idle (while
some zone was up, or none), and the preemptions. The difference to the optimum per item is where
the gap goes.

Then, on the traces whose probes count partial capacity (``available_nodes`` between 0 and the
gang), it prints what a partial count says in hindsight: how long an outage goes on from a step
where part of the gang was obtainable against one where none was, and how long runs last that
began right after such a step against after none (the signals ``broker`` reads causally, see
``policies.broker_policy_runs``).

``--oracle`` also runs ``broker`` told, in hindsight, how long each zone's current run will last
(its run-length estimate replaced by the true one), how long each outage will go on (its expected
wait for capacity replaced by the true one), and both: how close its rules get to the optimum
with perfect capacity signals, which no cloud's signal is. Simulator only: it swaps those two
estimates of ``policies.broker_policy`` for the truth while it runs, and puts them back.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from simulate import DEFAULT_TRACES, MULTI, job_for

import policies.broker_policy as broker_policy
from broker.sim.market import IDLE_CODE, ON_DEMAND_CODE, Market, RunResult, SimJob, Ticks
from broker.sim.runs import random_starts, run_policy
from policies.broker_policy_runs import RunLengths
from policies.history import MarketHistory
from policies.selection import Budget, SelectionRequest
from providers.trace import read_trace

POLICIES = ("up_multi", "skypilot_eager", "broker", "optimal")
ITEMS = ("spot work", "spot restart", "od work", "od restart", "egress")


def split(market: Market, job: SimJob, run: RunResult) -> dict[str, float]:
    """One run's cost by item, and its step counts, replaying its locations as the simulator bills them."""
    k = Ticks.of(job, market.tick_seconds).overhead
    node_hours = job.num_nodes * market.tick_seconds / 3600.0
    any_up: np.ndarray = np.asarray(market.up.any(axis=1))
    out = dict.fromkeys((*ITEMS, "od while up", "od entries", "idle while up", "idle while down"), 0.0)
    here, left = IDLE_CODE, 0
    for i, code in enumerate(run.locations.tolist()):
        at = min(run.start + i, market.num_ticks - 1)
        if code == IDLE_CODE:
            out["idle while up" if any_up[at] else "idle while down"] += 1
            here = IDLE_CODE
            continue
        if code != here:
            left = k
            out["od entries"] += code == ON_DEMAND_CODE
        here = code
        on_spot = code >= 0
        price = (market.spot_price[at, code] if on_spot else market.on_demand_min[at]) * node_hours
        item = ("spot " if on_spot else "od ") + ("restart" if left > 0 else "work")
        left = max(left - 1, 0)
        out[item] += price
        out["od while up"] += (not on_spot) and bool(any_up[at])
    out["egress"] = run.cost - sum(out[i] for i in ITEMS if i != "egress")
    out["preemptions"] = run.preemptions
    out["cost"] = run.cost
    return out


def steps_left(up: np.ndarray) -> np.ndarray:
    """[tick, zone]: steps the zone stays in its state (up or down) from that tick on, this one included."""
    left = np.ones(up.shape, dtype=np.int64)
    for t in range(up.shape[0] - 2, -1, -1):
        same = up[t + 1] == up[t]
        left[t, same] = left[t + 1, same] + 1
    return left


def oracle(market: Market, job: SimJob, ticks: list[int], best: float) -> None:
    """``broker`` told the true length of every run and outage (see the module's doc)."""
    gang = market.series.gang(job.num_nodes)
    up, left = gang.up, steps_left(gang.up)
    own_runs, own_wait = broker_policy.finished_runs, broker_policy.capacity_wait

    def true_run(history: MarketHistory, n: int, zone: int, window: int, down: bool = False) -> RunLengths:
        now = history.now
        if down or not up[now, zone]:
            return own_runs(history, n, zone, window, down)
        return RunLengths(np.array([gang.age[now, zone] + left[now, zone] - 1]))

    def true_wait(request: SelectionRequest, budget: Budget, horizon: int) -> float:
        assert request.history is not None
        now = request.history.now
        return float(min(0 if up[now].any() else int(left[now].min()), horizon))

    print("broker told the truth, in hindsight:", end="")
    for label, runs, wait in (("run lengths", true_run, own_wait), ("outage lengths", own_runs, true_wait),
                              ("both", true_run, true_wait)):
        broker_policy.finished_runs, broker_policy.capacity_wait = runs, wait
        market.series.memo.clear()
        try:
            found = run_policy(market, job, "broker", ticks)
        finally:
            broker_policy.finished_runs, broker_policy.capacity_wait = own_runs, own_wait
            market.series.memo.clear()
        cost = float(np.mean([r.cost for r in found]))
        met = float(np.mean([r.deadline_met for r in found]))
        print(f"  {label} {cost:.2f} $ ({cost / best:.3f} x, {met:.0%} met)", end="")
    print()


def gap(traces: Path, file: str, nodes: int, starts: int, seed: int, told: bool) -> None:
    market = Market(read_trace(traces / file).select("V100", 1), nodes)
    job = job_for(nodes)
    ticks = random_starts(market, job, starts, seed)
    print(f"\n== {file}: {nodes} node(s), 48 h job, 60 h deadline, {starts} starts (seed {seed})")
    rows: dict[str, dict[str, float]] = {}
    seconds: dict[str, float] = {}
    costs: dict[str, np.ndarray] = {}
    for name in POLICIES:
        clock = time.perf_counter()
        runs = run_policy(market, job, name, ticks)
        seconds[name] = time.perf_counter() - clock
        parts = [split(market, job, r) for r in runs]
        rows[name] = {key: float(np.mean([p[key] for p in parts])) for key in parts[0]}
        costs[name] = np.array([r.cost for r in runs])
    best = rows["optimal"]["cost"]
    print(f"{'policy':15s} {'cost $':>8s} {'vs opt':>6s} " + " ".join(f"{i:>12s}" for i in ITEMS)
          + f" {'od|up st':>8s} {'od ent':>6s} {'idle|up':>7s} {'idle|dn':>7s} {'preempt':>7s} {'s':>5s}")
    for name, row in rows.items():
        print(f"{name:15s} {row['cost']:8.2f} {row['cost'] / best:6.3f} "
              + " ".join(f"{row[i]:12.2f}" for i in ITEMS)
              + f" {row['od while up']:8.1f} {row['od entries']:6.2f} {row['idle while up']:7.1f}"
              f" {row['idle while down']:7.1f} {row['preemptions']:7.1f} {seconds[name]:5.1f}")
    b, o = rows["broker"], rows["optimal"]
    total = b["cost"] - o["cost"]
    print(f"broker - optimal = {total:.2f} $: " + ", ".join(
        f"{i} {b[i] - o[i]:+.2f} ({(b[i] - o[i]) / total:+.0%})" for i in ITEMS))
    cheaper = min(rows["up_multi"]["cost"], rows["skypilot_eager"]["cost"])
    ratio = costs["broker"] / costs["optimal"]
    print(f"broker vs the cheaper of up_multi and skypilot_eager: {b['cost'] / cheaper:.3f}; per start vs optimal: "
          f"quartiles {np.quantile(ratio, 0.25):.3f} / {np.median(ratio):.3f} / {np.quantile(ratio, 0.75):.3f}")
    if told:
        oracle(market, job, ticks, best)
    partial_counts(market, nodes)


def partial_counts(market: Market, nodes: int) -> None:
    """In hindsight, what a step with part of the gang obtainable says about the next steps."""
    available = market.trace.available_nodes
    up = market.up
    if nodes < 2 or not ((available > 0) & ~up).any():
        print("partial counts: none on this trace")
        return
    left_by: dict[str, list[int]] = {"part": [], "none": []}
    run_by: dict[str, list[int]] = {"part": [], "none": []}
    for zone in range(up.shape[1]):
        state = up[:, zone]
        flips = np.flatnonzero(state[1:] != state[:-1]) + 1
        for t in np.flatnonzero(~state):
            nxt = flips[(flips > t) & state[np.minimum(flips, len(state) - 1)]]
            if nxt.size:
                left_by["part" if available[t, zone] > 0 else "none"].append(int(nxt[0] - t))
        starts = flips[state[flips]]
        for s in starts:
            ends = flips[flips > s]
            if ends.size:
                run_by["part" if available[s - 1, zone] > 0 else "none"].append(int(ends[0] - s))
    for what, table in (("outage steps, steps until the zone is back", left_by),
                        ("runs by the step before them, run length", run_by)):
        for key, values in table.items():
            v = np.array(values)
            if v.size:
                print(f"  {what}: after {key:4s} obtainable: n {v.size:5d}  median {np.median(v):6.1f}  "
                      f"mean {v.mean():6.1f}  <= 3 steps {np.mean(v <= 3):4.0%}  > 12 steps {np.mean(v > 12):4.0%}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--traces", type=Path, default=DEFAULT_TRACES)
    parser.add_argument("--starts", type=int, default=60)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--only", help="only traces whose file name contains this")
    parser.add_argument("--oracle", action="store_true", help="also broker told each run's and outage's length")
    args = parser.parse_args()
    if not args.traces.is_dir():
        parser.error(f"--traces: no such directory {args.traces}")
    if args.starts < 1:
        parser.error("--starts: at least 1")
    for file, nodes in MULTI:
        if args.only is None or args.only in file:
            gap(args.traces, file, nodes, args.starts, args.seed, args.oracle)


if __name__ == "__main__":
    main()
