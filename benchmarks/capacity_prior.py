"""The selection policy with a capacity signal's hazard prior against without it, same starts.

    python benchmarks/capacity_prior.py [--traces DIR] [--starts 60] [--seed 0] [--window-days 7]

The shared market traces carry no cloud signal, so one is derived the way GCP describes its own
``estimatedUptime``: from the cloud's record of how long capacity lasted. At tick ``t`` a zone's
``estimated_uptime_s`` is the mean length of the gang's availability runs in that zone that ended
in the ``--window-days`` before ``t`` (nothing after ``t``; empty where none ended). The cloud sees
the whole trace's past; the policy sees what each setting gives it:

- **new to the region**: the broker starts with the job and has no market history before it (a
  team's first job in these zones): the trace is cut at the start, so the policy knows only what it
  saw since. This is where the prior is meant to help.
- **with the trace's past**: as ``benchmarks/simulate.py`` runs it, the whole trace before the start
  is the policy's history; the prior weighs only in zones with fewer than ``MIN_RUNS`` runs.

Each row: the mean cost of ``broker`` over the same starts without the signal (the baseline) and
with it, the difference, deadlines met, and ``up_multi``/``skypilot_eager`` on the same starts for
reference. Job shape as ``benchmarks/simulate.py``: 48 h of work, 60 h deadline, 0.2 h restart.
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import replace
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from broker.sim.market import Market, RunResult, SimJob, Ticks, simulate
from broker.sim.runs import random_starts
from policies import kinds
from policies.history import GangSeries
from providers.trace import MarketTrace, read_trace

DEFAULT_TRACES = Path(__file__).resolve().parents[2] / "shared" / "traces"
MULTI = (("aws-v100-2023-1node-9zones.csv.gz", 1), ("aws-v100-2023-16node-3zones.csv.gz", 16),
         ("aws-v100-2023-4node-3zones.csv.gz", 4))
REFERENCE = ("up_multi", "skypilot_eager")


def job_for(nodes: int) -> SimJob:
    return SimJob(num_nodes=nodes, work_s=48 * 3600, deadline_s=60 * 3600, restart_overhead_s=0.2 * 3600,
                  checkpoint_gb=50, egress_per_gb=0.02)


def derived_uptime(trace: MarketTrace, nodes: int, window_days: float) -> np.ndarray:
    """[tick, zone] mean length in seconds of the runs that ended in the window before each tick."""
    gang = GangSeries.build(trace.available_nodes, nodes)
    window = round(window_days * 86400 / trace.tick_seconds)
    now = np.arange(trace.num_ticks)
    out = np.full(trace.available_nodes.shape, np.nan)
    for z, (ends, lengths) in enumerate(zip(gang.run_end, gang.run_length, strict=True)):
        total = np.concatenate([[0], np.cumsum(lengths)])
        lo = np.searchsorted(ends, now - window, side="right")
        hi = np.searchsorted(ends, now, side="right")
        count = hi - lo
        with np.errstate(invalid="ignore", divide="ignore"):
            out[:, z] = np.where(count > 0, (total[hi] - total[lo]) / count * trace.tick_seconds, np.nan)
    return out


def cut(trace: MarketTrace, start: int, ticks: int, uptime: np.ndarray | None) -> MarketTrace:
    """The trace from ``start`` for ``ticks`` ticks, with the derived signal or none."""
    span = slice(start, min(start + ticks, trace.num_ticks))
    signals = {} if uptime is None else {"estimated_uptime_s": uptime[span]}
    return replace(trace, start=trace.time_of(start), spot_price=trace.spot_price[span],
                   on_demand_price=trace.on_demand_price[span], available_nodes=trace.available_nodes[span],
                   signals=signals)


def run(market: Market, job: SimJob, name: str, start: int) -> RunResult:
    return simulate(market, job, kinds.selection.get(name), start, name=name)


def compare(trace: MarketTrace, nodes: int, starts: list[int], uptime: np.ndarray, fresh: bool) -> dict[str, list]:
    job = job_for(nodes)
    found: dict[str, list] = {"without": [], "with": [], **{n: [] for n in REFERENCE}}
    if fresh:
        span = Ticks.of(job, trace.tick_seconds).deadline + 1
        for s in starts:
            plain = Market(cut(trace, s, span, None), nodes)
            told = Market(cut(trace, s, span, uptime), nodes)
            found["without"].append(run(plain, job, "broker", 0))
            found["with"].append(run(told, job, "broker", 0))
            for name in REFERENCE:
                found[name].append(run(plain, job, name, 0))
        return found
    plain = Market(trace, nodes)
    told = Market(replace(trace, signals={"estimated_uptime_s": uptime}), nodes)
    for s in starts:
        found["without"].append(run(plain, job, "broker", s))
        found["with"].append(run(told, job, "broker", s))
        for name in REFERENCE:
            found[name].append(run(plain, job, name, s))
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--traces", type=Path, default=DEFAULT_TRACES)
    parser.add_argument("--starts", type=int, default=60)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--window-days", type=float, default=7.0)
    args = parser.parse_args()
    if not 1 <= args.starts <= 10_000:
        parser.error(f"--starts: expected 1 to 10000, got {args.starts}")
    if not 0 < args.window_days <= 60:  # NaN fails this too
        parser.error(f"--window-days: expected more than 0 and at most 60, got {args.window_days}")
    if not args.traces.is_dir():
        raise SystemExit(f"--traces {args.traces}: no such folder (the shared market traces)")
    print(f"broker with a derived estimated-uptime prior vs without, {args.starts} starts (seed {args.seed}), "
          f"uptime = mean run ending in the {args.window_days:g} days before each tick")
    print(f"{'trace':38s} {'setting':22s} {'without $':>10s} {'with $':>10s} {'change':>8s} "
          f"{'better/worse':>12s} {'deadlines':>10s} {'up_multi $':>11s} {'sky_eager $':>12s} {'s':>6s}")
    for file, nodes in MULTI:
        trace = read_trace(args.traces / file).select("V100", 1)
        job = job_for(nodes)
        starts = random_starts(Market(trace, nodes), job, args.starts, args.seed)
        uptime = derived_uptime(trace, nodes, args.window_days)
        for fresh in (True, False):
            clock = time.perf_counter()
            found = compare(trace, nodes, starts, uptime, fresh)
            mean = {k: float(np.mean([r.cost for r in v])) for k, v in found.items()}
            diffs = [b.cost - a.cost for a, b in zip(found["without"], found["with"], strict=True)]
            better, worse = sum(d < -1e-9 for d in diffs), sum(d > 1e-9 for d in diffs)
            met = [np.mean([r.deadline_met for r in found[k]]) for k in ("without", "with")]
            setting = "new to the region" if fresh else "with the trace's past"
            print(f"{file:38s} {setting:22s} {mean['without']:10.2f} {mean['with']:10.2f} "
                  f"{mean['with'] / mean['without'] - 1:+8.1%} {better:>5d}/{worse:<6d} "
                  f"{met[0]:4.0%}/{met[1]:4.0%} {mean['up_multi']:11.2f} {mean['skypilot_eager']:12.2f} "
                  f"{time.perf_counter() - clock:6.1f}", flush=True)


if __name__ == "__main__":
    main()
