"""Spot policy simulation on the shared real traces: NSDI'24 Table 3, then every policy multi-zone.

    python benchmarks/simulate.py [--traces DIR] [--starts 300] [--multi-starts 60] [--seed 0]

Part 1 is the "Can't Be Late" Table 3 setting on the 2-week 2-zone V100 trace: a 48 h job, a 60 h
deadline (job fraction 0.8), 0.2 h restart overhead, ``--starts`` random starts; single-zone
policies (greedy, uniform_progress, and optimal for the comparison) run in each (instance type,
zone) alone, as the paper does; the trace holds 4 of the paper's 8 scenarios (p3.2xlarge and
p3.16xlarge in us-west-2a/b; the K80 ones are not in it). Hours are compute hours on on-demand
and spot, restart overhead excluded, as in the paper.

Part 2 runs every policy on the three multi-zone traces with the same job shape (48 h of work,
60 h deadline, 0.2 h restart, 50 GB checkpoint at $0.02/GB between regions): the setting the
paper's Table 3 uses, so the figures compare across parts; the gang is the trace's own probe
size (1, 16 and 4 nodes). Each prints mean cost, cost vs on-demand and vs optimal, deadlines met,
and whether the broker policy meets its targets.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from broker.sim.market import Market, SimJob
from broker.sim.runs import random_starts, run_policy, summarise
from providers.trace import read_trace

DEFAULT_TRACES = Path(__file__).resolve().parents[2] / "shared" / "traces"
TABLE3 = "aws-v100-2022-1node-2zones.csv.gz"
PAPER = {"greedy": (30.8, 17.2), "uniform_progress": (25.1, 22.9), "optimal": (20.7, 27.4)}
MULTI = (("aws-v100-2023-1node-9zones.csv.gz", 1), ("aws-v100-2023-16node-3zones.csv.gz", 16),
         ("aws-v100-2023-4node-3zones.csv.gz", 4))
MULTI_POLICIES = ("on_demand", "greedy", "uniform_progress", "up_multi", "skypilot_eager", "cheapest_spot",
                  "broker")


def job_for(nodes: int) -> SimJob:
    return SimJob(num_nodes=nodes, work_s=48 * 3600, deadline_s=60 * 3600, restart_overhead_s=0.2 * 3600,
                  checkpoint_gb=50, egress_per_gb=0.02)


def table3(traces: Path, starts: int, seed: int) -> None:
    print(f"== NSDI'24 Table 3 setting: {TABLE3}, 48 h job, 60 h deadline, 0.2 h restart, {starts} starts "
          "per (instance type, zone)")
    whole = read_trace(traces / TABLE3)
    hours: dict[str, list[tuple[float, float]]] = {}
    timed = cpu = 0.0
    optimal_s: list[float] = []
    for gpus in (1, 8):
        trace = whole.select("V100", gpus)
        job = job_for(1)
        both = Market(trace, 1)
        ticks = random_starts(both, job, starts, seed)
        clock, cpu_clock = time.perf_counter(), time.process_time()
        for name in ("on_demand", "up_multi", "skypilot_eager", "broker"):
            run_policy(both, job, name, ticks)
        timed += time.perf_counter() - clock
        cpu += time.process_time() - cpu_clock
        for z in range(len(trace.zones)):
            market = both.zone(z)
            for name in ("greedy", "uniform_progress", "optimal"):
                clock, cpu_clock = time.perf_counter(), time.process_time()
                runs = run_policy(market, job, name, ticks)
                spent = time.perf_counter() - clock
                if name == "optimal":
                    optimal_s.append(spent / len(ticks))
                else:
                    timed += spent
                    cpu += time.process_time() - cpu_clock
                hours.setdefault(name, []).extend((r.on_demand_work_hours, r.spot_work_hours) for r in runs)
    print(f"{'policy':18s} {'on-demand h':>12s} {'spot h':>8s}   {'paper on-demand h':>17s} {'paper spot h':>12s}")
    for name, pairs in hours.items():
        od, sp = np.mean(pairs, axis=0)
        paper = PAPER[name]
        print(f"{name:18s} {od:12.1f} {sp:8.1f}   {paper[0]:17.1f} {paper[1]:12.1f}")
    print(f"time: every policy but optimal, {starts} starts x 4 scenarios: {timed:.1f} s wall, {cpu:.1f} s CPU; "
          f"optimal {np.mean(optimal_s):.3f} s per start (single zone)")


def multi_zone(traces: Path, starts: int, seed: int) -> None:
    for file, nodes in MULTI:
        trace = read_trace(traces / file).select("V100", 1)
        market = Market(trace, nodes)
        job = job_for(nodes)
        ticks = random_starts(market, job, starts, seed)
        print(f"\n== {file}: {nodes} node(s), 48 h job, 60 h deadline, {starts} starts, {len(trace.zones)} zones")
        results = {}
        seconds = {}
        for name in (*MULTI_POLICIES, "optimal"):
            clock = time.perf_counter()
            results[name] = run_policy(market, job, name, ticks)
            seconds[name] = time.perf_counter() - clock
        optimal_cost = float(np.mean([r.cost for r in results["optimal"]]))
        print(f"{'policy':18s} {'mean cost $':>12s} {'vs on-demand':>13s} {'vs optimal':>11s} {'deadlines':>10s} "
              f"{'preempt':>8s} {'time s':>7s}")
        means = {}
        for name, runs in results.items():
            mean = summarise(name, runs, optimal_cost).mean
            means[name] = mean
            print(f"{name:18s} {mean['cost']:12.2f} {mean['cost_vs_on_demand']:13.3f} {mean['cost_vs_optimal']:11.3f} "
                  f"{mean['deadline_met']:10.0%} {mean['preemptions']:8.1f} {seconds[name]:7.1f}")
        b = means["broker"]
        checks = [
            ("<= 1.10 x optimal", b["cost_vs_optimal"] <= 1.10, f"{b['cost_vs_optimal']:.3f}"),
            (">= 10% cheaper than up_multi", b["cost"] <= 0.9 * means["up_multi"]["cost"],
             f"{1 - b['cost'] / means['up_multi']['cost']:+.1%}"),
            (">= 10% cheaper than skypilot_eager", b["cost"] <= 0.9 * means["skypilot_eager"]["cost"],
             f"{1 - b['cost'] / means['skypilot_eager']['cost']:+.1%}"),
            (">= 60% cheaper than on-demand (optimal: "
             f"{1 - means['optimal']['cost_vs_on_demand']:.0%})", b["cost_vs_on_demand"] <= 0.4,
             f"{1 - b['cost_vs_on_demand']:.1%}"),
            ("every deadline met", b["deadline_met"] == 1.0, f"{b['deadline_met']:.0%}"),
        ]
        for label, ok, figure in checks:
            print(f"  broker {label}: {figure} {'met' if ok else 'NOT met'}")
        print(f"  optimal: {seconds['optimal'] / len(ticks):.2f} s per start")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--traces", type=Path, default=DEFAULT_TRACES)
    parser.add_argument("--starts", type=int, default=300, help="Table 3 starts per scenario")
    parser.add_argument("--multi-starts", type=int, default=60, help="starts per multi-zone trace")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--skip-table3", action="store_true")
    parser.add_argument("--skip-multi", action="store_true")
    args = parser.parse_args()
    if not args.traces.is_dir():
        parser.error(f"--traces: no such directory {args.traces}")
    if not args.skip_table3:
        table3(args.traces, args.starts, args.seed)
    if not args.skip_multi:
        multi_zone(args.traces, args.multi_starts, args.seed)


if __name__ == "__main__":
    main()
