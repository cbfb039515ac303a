"""Work lost and checkpoint overhead under each checkpointing policy, on the real availability traces.

    python benchmarks/checkpointing.py [--traces DIR] [--restart-s 720] [--unannounced 0.05]

A job runs on spot in one zone of a trace for every availability run of its gang there: it starts
(after the restart overhead) when the zone can take the gang and is preempted at the first tick it
cannot. Each preemption costs the work since the last complete checkpoint, unless the checkpoint
fits in the cloud's notice (AWS 120 s, GCP and Azure 30 s); a share of preemptions (``--unannounced``)
comes with no usable notice at all. Periodic checkpoints cost their write time each.

For checkpoints of 10 s, 100 s and 300 s (5, 50 and 150 GB at 500 MB/s) and both notice lengths it
prints, per policy, the share of running time wasted (work lost plus checkpoint overhead):

- ``notice_only``: checkpoint only on a notice (what the broker did before);
- ``fixed_interval``: every 15 minutes of work, as many training scripts do;
- ``young_daly``: the broker's rule (``policies/checkpointing.py``), with the zone's hazard learned
  online from the runs that ended before each run began (one preemption per day as the prior).
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from policies.checkpointing import NOTICE_MARGIN_S, CheckpointRequest, fixed_interval, notice_only, young_daly
from providers.trace import read_trace

TRACES = (("aws-v100-2023-1node-9zones.csv.gz", 1), ("aws-v100-2022-1node-2zones.csv.gz", 1),
          ("aws-v100-2023-16node-3zones.csv.gz", 16), ("aws-v100-2023-4node-3zones.csv.gz", 4))
CHECKPOINT_SECONDS = (10.0, 100.0, 300.0)
NOTICES = (("GCP/Azure", 30.0), ("AWS", 120.0))
POLICIES = {"notice_only": notice_only, "fixed_interval": fixed_interval, "young_daly": young_daly}
PRIOR_SECONDS = 24 * 3600.0  # one preemption per day of running, before a zone has any history


@dataclass(frozen=True)
class Run:
    start_s: float  # when the run began, seconds from the trace's start
    seconds: float
    preempted: bool  # False when the trace ended first


@dataclass
class Tally:
    running_s: float = 0.0
    lost_s: float = 0.0
    overhead_s: float = 0.0

    @property
    def waste(self) -> float:
        return (self.lost_s + self.overhead_s) / self.running_s if self.running_s else 0.0


def runs_of(up: np.ndarray, tick_s: float) -> list[Run]:
    """Maximal spells where the zone can take the gang."""
    runs, t, ticks = [], 0, len(up)
    while t < ticks:
        if not up[t]:
            t += 1
            continue
        begin = t
        while t < ticks and up[t]:
            t += 1
        runs.append(Run(begin * tick_s, (t - begin) * tick_s, preempted=t < ticks))
    return runs


def play(runs: list[Run], policy: str, checkpoint_s: float, notice_s: float, restart_s: float,
         unannounced: float) -> Tally:
    tally = Tally()
    seen_preemptions, seen_running = 0, 0.0
    notice_fits = checkpoint_s + NOTICE_MARGIN_S <= notice_s
    for run in runs:
        hazard = (seen_preemptions + 1) / (seen_running + PRIOR_SECONDS)
        plan = POLICIES[policy](CheckpointRequest(hazard, checkpoint_s, notice_s, unannounced))
        compute = max(run.seconds - restart_s, 0.0)
        tally.running_s += run.seconds
        tally.overhead_s += run.seconds - compute  # restarts are paid by every policy alike
        if plan.interval_s is None:
            kept_at_loss = 0.0
            periodic = 0
        else:
            cycle = plan.interval_s + checkpoint_s
            periodic = int(compute // cycle)
            kept_at_loss = periodic * cycle
        tally.overhead_s += periodic * checkpoint_s
        if run.preempted:
            unsaved = compute - kept_at_loss
            if notice_fits:
                # The notice checkpoint keeps the work, except when no usable notice came.
                tally.overhead_s += (1 - unannounced) * checkpoint_s
                tally.lost_s += unannounced * unsaved
            else:
                tally.lost_s += unsaved
        # The hazard that matters is per second of work at risk: a run that ends inside its restart
        # put no work at risk, and counting it would ask for checkpoints more often than pays.
        seen_preemptions += int(run.preempted and compute > 0)
        seen_running += compute
    return tally


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--traces", type=Path, default=Path(__file__).resolve().parents[2] / "shared" / "traces")
    parser.add_argument("--restart-s", type=float, default=720.0)
    parser.add_argument("--unannounced", type=float, default=0.05)
    args = parser.parse_args()
    if not args.traces.is_dir():
        print(f"no traces at {args.traces}: pass --traces DIR", file=sys.stderr)
        return 2
    print(f"restart overhead {args.restart_s:.0f} s, unannounced preemptions {args.unannounced:.0%}; "
          "waste = (work lost + checkpoint overhead + restarts) / running time")
    header = f"{'trace':38} {'ckpt':>5} {'notice':>10} " + " ".join(f"{p:>15}" for p in POLICIES) + "  rule vs best"
    print(header)
    for name, nodes in TRACES:
        path = args.traces / name
        if not path.exists():
            continue
        trace = read_trace(path).select(gpus_per_node=1)
        up = trace.available_nodes >= nodes
        zone_runs = [runs_of(up[:, z], trace.tick_seconds) for z in range(up.shape[1])]
        preemptions = sum(r.preempted for runs in zone_runs for r in runs)
        hours = sum(r.seconds for runs in zone_runs for r in runs) / 3600
        for checkpoint_s in CHECKPOINT_SECONDS:
            for notice_name, notice_s in NOTICES:
                waste = {}
                for policy in POLICIES:
                    total = Tally()
                    for runs in zone_runs:
                        t = play(runs, policy, checkpoint_s, notice_s, args.restart_s, args.unannounced)
                        total.running_s += t.running_s
                        total.lost_s += t.lost_s
                        total.overhead_s += t.overhead_s
                    waste[policy] = total.waste
                best = min(v for k, v in waste.items() if k != "young_daly")
                label = f"{name.removesuffix('.csv.gz')} ({preemptions} preemptions in {hours:.0f} h)"
                cells = " ".join(f"{waste[p]:>14.1%} " for p in POLICIES)
                print(f"{label[:38]:38} {checkpoint_s:>4.0f}s {notice_name:>10} {cells} "
                      f"{waste['young_daly'] - best:+.1%}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
