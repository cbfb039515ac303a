"""How well does the broker predict a job's run time before it starts, from the jobs before it?

    python benchmarks/prediction.py [--traces DIR]

On each Philly workload (``philly/workload-{1..4}.csv``: 160 jobs with model, GPUs and duration),
every job's duration is predicted at its submission from the earlier jobs, the way the broker
predicts from the jobs of the same name and team
(``policies/prediction.py``, history source): here "the same name" is the same model at the same
size. The baseline is what a tool with no model has: the mean of all earlier jobs. Two passes:
``trace`` gives both every earlier submitted job's duration, as a finished history would;
``online`` gives both only the jobs finished by then, and the broker also the ones still running
as lower bounds (what a live broker knows).
Printed per workload: the median factor by which a prediction is off (``exp(median |ln(pred /
actual)|)``, the fair measure for run times spread over four orders of magnitude), the median
absolute percentage error, the mean absolute error in hours,
how many jobs had like-for-like history, and how often the actual duration fell in the broker's
10-90 % interval.
"""

from __future__ import annotations

import argparse
import csv
import math
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from policies.prediction import PredictionRequest, predict


@dataclass(frozen=True)
class Job:
    submit_s: float
    duration_s: float
    key: tuple[str, int]


def read_workload(path: Path) -> list[Job]:
    with path.open() as handle:
        rows = list(csv.DictReader(handle))
    jobs = [Job(float(r["submit_time"]), float(r["duration"]), (r["model"], int(r["num_gpus"]))) for r in rows]
    return sorted(jobs, key=lambda j: j.submit_s)


def evaluate(jobs: list[Job], online: bool) -> dict[str, float]:
    """Trace order (``online=False``): every earlier submitted job's duration is known. Online: only
    the jobs finished by then are, and the ones still running count as lower bounds."""
    ours_err, base_err, ours_abs, base_abs, ours_log, base_log = [], [], [], [], [], []
    covered = with_history = 0
    for job in jobs:
        earlier = [j for j in jobs if j.submit_s < job.submit_s]
        finished = [j for j in earlier if j.submit_s + j.duration_s <= job.submit_s] if online else earlier
        if not finished:
            continue
        baseline = statistics.fmean(j.duration_s for j in finished)
        like = tuple(j.duration_s for j in finished if j.key == job.key)
        running = tuple(job.submit_s - j.submit_s for j in earlier
                        if online and j.key == job.key and job.submit_s < j.submit_s + j.duration_s)
        found = predict(PredictionRequest(now_s=job.submit_s, history_s=like, running_s=running)) if like else None
        if found is not None:
            with_history += 1
            guess = found.remaining_s
            covered += found.low_s <= job.duration_s <= found.high_s
        else:
            guess = baseline  # nothing like it yet: the broker knows no more than the baseline
        ours_err.append(abs(guess - job.duration_s) / job.duration_s)
        base_err.append(abs(baseline - job.duration_s) / job.duration_s)
        ours_log.append(abs(math.log(guess / job.duration_s)))
        base_log.append(abs(math.log(baseline / job.duration_s)))
        ours_abs.append(abs(guess - job.duration_s) / 3600)
        base_abs.append(abs(baseline - job.duration_s) / 3600)
    return {
        "predicted": len(ours_err), "with_history": with_history,
        "ours_mdape": statistics.median(ours_err), "base_mdape": statistics.median(base_err),
        "ours_factor": math.exp(statistics.median(ours_log)), "base_factor": math.exp(statistics.median(base_log)),
        "ours_mae_h": statistics.fmean(ours_abs), "base_mae_h": statistics.fmean(base_abs),
        "coverage": covered / with_history if with_history else float("nan"),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--traces", type=Path, default=Path(__file__).resolve().parents[2] / "shared" / "traces")
    args = parser.parse_args()
    paths = sorted((args.traces / "philly").glob("workload-*.csv"))
    if not paths:
        print(f"no Philly workloads under {args.traces / 'philly'}: pass --traces DIR", file=sys.stderr)
        return 2
    print(f"{'workload':20} {'jobs':>5} {'history':>8} {'median factor off: broker':>26} {'baseline':>9} "
          f"{'median |err|: broker':>21} {'baseline':>9} {'MAE h: broker':>14} {'baseline':>9} "
          f"{'in 10-90% interval':>19}")
    for online in (False, True):
        for path in paths:
            r = evaluate(read_workload(path), online)
            label = f"{path.stem} {'online' if online else 'trace'}"
            print(f"{label:20} {r['predicted']:>5} {r['with_history']:>8} {r['ours_factor']:>25.2f}x "
                  f"{r['base_factor']:>8.2f}x {r['ours_mdape']:>21.1%} {r['base_mdape']:>9.1%} "
                  f"{r['ours_mae_h']:>14.2f} {r['base_mae_h']:>9.2f} {r['coverage']:>19.0%}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
