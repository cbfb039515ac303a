"""The spot policies on a grid of job shapes over every shared market trace, against the optimum.

    python benchmarks/grid.py [--traces DIR] [--starts 4] [--seed 0] [--policy broker] [--cache FILE]
                              [--only TRACE-SUBSTRING] [--gangs ends|pow2|all] [--no-optimum]
                              [--work HOURS ...] [--slack X ...]

For every market trace (each accelerator type of it apart), work of 10, 48 and 100 hours (those
whose deadline fits the trace), deadline slack of 1.1x, 1.5x and 2x the work, and the gang sizes the
trace's availability counts describe (``ends``, the default: 1 node and the largest gang the trace
counts; ``pow2``: 1, 2, 4, ... up to the largest; ``all``: every size), it runs ``--policy``
(default ``broker``), ``up_multi``, ``skypilot_eager``, ``uniform_progress`` (per zone, as
published) and the omniscient ``optimal`` on the same ``--starts`` random starts (0.2 h restart, 50
GB checkpoint at $0.02/GB between regions), and prints per cell the policy's mean cost against the
optimum and against the best of the three baselines for that cell, the standard error of that ratio
(``± se``, from the per-start cost differences on the same starts: what one cell's figure can
resolve), and the deadlines met. The optimum dominates the run time (seconds per start at 100 h of
work): ``--cache FILE`` keeps the baselines' and the optimum's means between runs (they do not
change when the policy does; with ``--no-optimum``, the baselines' alone); delete the file to
measure them again. ``--no-optimum`` leaves the optimum out (its columns print as ``nan``): with
many starts, the baselines and the policy alone. ``--work`` and ``--slack`` keep only those shapes
(to measure a few cells on many starts).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from broker.sim.market import Market, SimJob
from broker.sim.runs import random_starts, run_policy
from providers.trace import read_trace

DEFAULT_TRACES = Path(__file__).resolve().parents[2] / "shared" / "traces"
WORK_HOURS = (10, 48, 100)
SLACKS = (1.1, 1.5, 2.0)
BASELINES = ("up_multi", "skypilot_eager", "uniform_progress")
CACHED = (*BASELINES, "optimal")


def gang_sizes(largest: int, which: str) -> list[int]:
    if which == "all":
        return list(range(1, largest + 1))
    if which == "ends":
        return sorted({1, largest})
    sizes, size = [], 1
    while size < largest:
        sizes.append(size)
        size *= 2
    return [*sizes, largest]


def markets(traces: Path, only: str | None) -> list[tuple[str, object]]:
    found = []
    for path in sorted(traces.glob("*.csv.gz")):
        if only and only not in path.name:
            continue
        whole = read_trace(path)
        kinds = sorted({(z.accelerator, z.gpus_per_node) for z in whole.zones})
        for accelerator, gpus in kinds:
            label = path.name.removesuffix(".csv.gz") + (f" {accelerator}:{gpus}" if len(kinds) > 1 else "")
            found.append((label, whole.select(accelerator, gpus)))
    return found


def run_cell(market: Market, job: SimJob, starts: list[int], names: tuple[str, ...]) -> dict[str, dict]:
    out: dict[str, dict] = {}
    for name in names:
        clock = time.perf_counter()
        runs = run_policy(market, job, name, starts)
        # a single-zone policy runs once per zone: its cost at a start is the mean over its zones
        per_start = np.array([r.cost for r in runs]).reshape(-1, len(starts)).mean(axis=0)
        out[name] = {"cost": float(per_start.mean()),
                     "met": float(np.mean([r.deadline_met for r in runs])),
                     "costs": per_start.tolist(),
                     "seconds": time.perf_counter() - clock}
    return out


def paired_error(mine: dict, best: dict) -> float:
    """Standard error of ``mine``'s mean cost over ``best``'s, from the per-start differences on the
    same starts (nan when the cache predates per-start costs or there is one start)."""
    a, b = np.array(mine.get("costs", [])), np.array(best.get("costs", []))
    if len(a) < 2 or len(a) != len(b):
        return float("nan")
    return float(np.std(a - b, ddof=1) / np.sqrt(len(a)) / np.mean(b))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--traces", type=Path, default=DEFAULT_TRACES)
    parser.add_argument("--starts", type=int, default=4, help="random starts per cell (the same for every policy)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--policy", default="broker")
    parser.add_argument("--cache", type=Path, help="JSON file keeping the baselines' and optimum's means")
    parser.add_argument("--only", help="only traces whose file name contains this")
    parser.add_argument("--gangs", choices=("ends", "pow2", "all"), default="ends",
                        help="gang sizes: 1 and the largest the trace counts (default), powers of two, or all")
    parser.add_argument("--no-optimum", action="store_true",
                        help="leave the omniscient optimum out (fast: for many starts against the baselines)")
    parser.add_argument("--work", type=float, nargs="+", default=WORK_HOURS, metavar="HOURS",
                        help=f"work of the job shapes, in hours (default: {' '.join(map(str, WORK_HOURS))})")
    parser.add_argument("--slack", type=float, nargs="+", default=SLACKS, metavar="X",
                        help=f"deadline over work of the job shapes (default: {' '.join(map(str, SLACKS))})")
    args = parser.parse_args()
    if any(not 0 < w <= 10_000 for w in args.work):
        parser.error("--work: expected hours in (0, 10000]")
    if any(not 1 <= x <= 100 for x in args.slack):
        parser.error("--slack: expected a multiple of the work in [1, 100]")
    if not args.traces.is_dir():
        parser.error(f"--traces: no such directory {args.traces}")
    if args.starts < 1:
        parser.error("--starts: expected a positive count")
    cache: dict[str, dict[str, dict[str, float]]] = {}
    if args.cache is not None and args.cache.exists():
        cache = json.loads(args.cache.read_text())

    print(f"{args.starts} random starts per cell (seed {args.seed}), the same for every policy; 0.2 h restart, "
          f"50 GB checkpoint at $0.02/GB; gangs: {args.gangs}; uniform_progress is the mean over its zones")
    print(f"{'trace':44s} {'gang':>4s} {'work h':>6s} {'slack':>5s} {'optimal $':>10s} {'vs opt':>7s} "
          f"{'best baseline':>16s} {'b/opt':>6s} {'vs best':>7s} {'± se':>6s} {'met':>5s} {'b. met':>6s}")
    clock = time.perf_counter()
    worst: dict[str, tuple[float, float, float]] = {}
    cells: list[tuple[float, float]] = []  # (vs best baseline, its standard error) per cell
    for label, trace in markets(args.traces, args.only):
        largest = int(trace.available_nodes.max())  # type: ignore[attr-defined]
        hours = trace.num_ticks * trace.tick_seconds / 3600  # type: ignore[attr-defined]
        for nodes in gang_sizes(max(largest, 1), args.gangs):
            market = Market(trace, nodes)  # type: ignore[arg-type]
            for work in args.work:
                for slack in args.slack:
                    if work * slack > hours * 0.8:
                        continue  # leave a fifth of the trace for the starts
                    job = SimJob(num_nodes=nodes, work_s=work * 3600, deadline_s=work * slack * 3600,
                                 restart_overhead_s=0.2 * 3600, checkpoint_gb=50, egress_per_gb=0.02)
                    starts = random_starts(market, job, args.starts, args.seed)
                    key = f"{label}|{nodes}|{work:g}|{slack}|{args.starts}|{args.seed}"
                    cell = (cache.get(key) or cache.get(key + "|no-optimum")) if args.no_optimum else cache.get(key)
                    if cell is None and args.no_optimum:
                        cell = cache[key + "|no-optimum"] = run_cell(market, job, starts, BASELINES)
                        cell["optimal"] = {"cost": float("nan"), "met": float("nan"), "seconds": 0.0}
                    elif cell is None:
                        cell = cache[key] = run_cell(market, job, starts, CACHED)
                    if args.cache is not None:
                        args.cache.write_text(json.dumps(cache))
                    cell = {**cell, **run_cell(market, job, starts, (args.policy,))}
                    optimum = cell["optimal"]["cost"]
                    best = min(BASELINES, key=lambda n: cell[n]["cost"])
                    mine = cell[args.policy]
                    vs_opt, vs_best = mine["cost"] / optimum, mine["cost"] / cell[best]["cost"]
                    print(f"{label:44s} {nodes:4d} {work:6g} {slack:5.1f} {optimum:10.2f} {vs_opt:7.3f} "
                          f"{best:>16s} {cell[best]['cost'] / optimum:6.3f} {vs_best:7.3f} "
                          f"{paired_error(mine, cell[best]):6.3f} {mine['met']:5.0%} "
                          f"{cell[best]['met']:6.0%}", flush=True)
                    cells.append((vs_best, paired_error(mine, cell[best])))
                    w = worst.get(label, (0.0, 0.0, 1.0))
                    worst[label] = (max(w[0], vs_opt), max(w[1], vs_best), min(w[2], mine["met"]))
    print(f"\nper trace, {args.policy}: worst cell vs optimal, worst vs the best baseline, fewest deadlines met")
    for label, (vs_opt, vs_best, met) in worst.items():
        print(f"{label:44s} {'-' if args.no_optimum else f'{vs_opt:.3f}':>7s} {vs_best:7.3f} {met:5.0%}")
    if cells:
        ratios = np.array([c[0] for c in cells])
        errors = np.array([c[1] for c in cells])
        within = int((ratios <= 1.01).sum())
        print(f"all {len(cells)} cells, {args.policy} vs the best baseline: {within} within 1.01 x, "
              f"mean {ratios.mean():.4f}, worst {ratios.max():.3f}; above 1.01 x by more than 2 standard errors: "
              f"{int((ratios - 2 * errors > 1.01).sum())}; median standard error {np.nanmedian(errors):.3f}")
    print(f"time: {time.perf_counter() - clock:.0f} s")


if __name__ == "__main__":
    main()
