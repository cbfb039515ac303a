"""Idle between jobs: a queue of short multi-node jobs through a cluster pool, eager allocation off and on.

The same queue runs twice on the local backend, each time in a fresh broker home: 20 jobs of one
or two 4-GPU nodes (real ``examples/train.py`` processes, a node agent each), all submitted at once,
through a pool of at most 16 GPUs that keeps an unheld cluster for 10 market minutes. First with the
eager policy ``off`` (the baseline), then ``eager``. Printed per run, in market seconds:

- the gap from a job's end to the next first step: for every job end while jobs were queued, the
  time to the first step (first progress report) of one of the jobs queued then; median and p95;
  ``to start``: the median time to the broker starting one of them (the rest is process start-up);
- queue drain: ledger GPU-hours booked ``queue_drain``, and their share of all GPU-hours; ``exact``:
  the same from the allocations to the second: every gap between two allocations of a cluster (the
  ledger, split to the second where holders change, books a gap queue drain only while a job waits
  or is heading there; runs recorded before that split sampled each minute's start, and missed most);
- the ledger's total cost, and the wall time of the run;
- prediction error: over the finished jobs, the median of each job's median |predicted - actual
  finish| as a share of the time then left, per prediction source (progress, work, history).

    python benchmarks/eager.py [--jobs 20] [--speed 10] [--setup-seconds 1] [--explain]
"""

from __future__ import annotations

import argparse
import itertools
import logging
import statistics
import sys
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

JOB = """\
name: {name}
num_nodes: {nodes}
resources:
  accelerators: V100:4
workdir: {workdir}
{setup}run: python train.py --steps {steps} --step-seconds {step_s} --checkpoint-every 1000
{broker}"""
SHAPES = [(1, 300), (2, 200), (1, 450), (2, 350), (1, 200), (2, 450), (1, 350), (2, 300)]


def workload(count: int, step_s: float, speed: float, setup_s: float = 0.0) -> list[tuple[str, str]]:
    jobs = []
    # Stands for installing the job's dependencies: the part of a start eager allocation can run ahead.
    setup = f"setup: sleep {setup_s:g}\n" if setup_s > 0 else ""
    for i in range(count):
        nodes, steps = SHAPES[i % len(SHAPES)]
        # Half state their work (as a team that knows its jobs would); the rest are predicted from history.
        work = f"broker:\n  work: {steps * step_s * speed:.0f}s\n" if i % 2 == 0 else ""
        name = f"train-{nodes}n-{steps}"
        jobs.append((name, JOB.format(name=name, nodes=nodes, workdir=ROOT / "examples", steps=steps,
                                      step_s=step_s, broker=work, setup=setup)))
    return jobs


def run(policy: str, jobs: list[tuple[str, str]], speed: float, timeout_s: float) -> dict[str, Any]:
    from broker.config.settings import load_settings
    from broker.runtime import assemble
    from broker.spec.job import parse_job_spec
    from providers.base import SpotQuote
    from providers.trace import write_trace

    with tempfile.TemporaryDirectory() as tmp:
        home = Path(tmp) / "home"
        market = Path(tmp) / "market.csv"
        start = datetime(2026, 1, 1, tzinfo=UTC)
        write_trace(market, [SpotQuote("aws", "us-east-1", "us-east-1a", "p3.8xlarge", "V100", 4, 3.67, 12.24,
                                       start + timedelta(minutes=t), available_nodes=8) for t in range(24 * 60)])
        settings = load_settings(home=home, market=market, speed=speed, local_provision_seconds=120.0,
                                 max_gpus=16, pool_idle_seconds=600.0, eager_policy=policy,
                                 eager_lead_seconds=120.0, poll_seconds=0.2)
        broker = assemble(settings, fresh_market=True)
        engine = broker.start()
        began = time.monotonic()
        try:
            ids = [engine.submit(parse_job_spec(text, source=str(Path(tmp) / f"{name}-{i}.yaml")))
                   for i, (name, text) in enumerate(jobs)]
            while time.monotonic() - began < timeout_s:
                engine.step()
                if _all_done(engine, ids):
                    break
                time.sleep(settings.poll_seconds)
            else:
                raise SystemExit(f"{policy}: the queue did not finish in {timeout_s:.0f} wall s")
            for _ in range(3):  # let the last minutes be metered and idle clusters go
                engine.step()
            return measure(engine, ids) | {"wall_s": time.monotonic() - began}
        finally:
            broker.close()


def _all_done(engine: Any, ids: list[str]) -> bool:
    from sqlalchemy import select

    from broker.store.tables import JobRow

    with engine.store.transaction() as s:
        states = set(s.scalars(select(JobRow.state).where(JobRow.id.in_(ids))))
    return states <= {"SUCCEEDED", "FAILED", "CANCELLED"}


def measure(engine: Any, ids: list[str]) -> dict[str, Any]:
    from sqlalchemy import func, select

    from broker.store.tables import AllocationRow, ClusterRow, JobRow, LedgerRow, PredictionRow, ProgressRow

    with engine.store.transaction() as s:
        jobs = list(s.scalars(select(JobRow).where(JobRow.id.in_(ids))))
        first_step = {job_id: at for job_id, at in s.execute(
            select(ProgressRow.job_id, func.min(ProgressRow.at)).group_by(ProgressRow.job_id))}
        ledger = list(s.execute(select(LedgerRow.usage, LedgerRow.gpus, LedgerRow.seconds, LedgerRow.cost)))
        predictions = list(s.scalars(select(PredictionRow)))
        allocations = list(s.scalars(select(AllocationRow).order_by(AllocationRow.started_at)))
        cluster_gpus = {c.id: c.num_nodes * c.gpus_per_node for c in s.scalars(select(ClusterRow))}
    started = {}
    for alloc in allocations:
        started.setdefault(alloc.job_id, alloc.started_at)
    gaps, start_gaps, worst = [], [], []
    for ender in sorted((j for j in jobs if j.finished_at), key=lambda j: j.finished_at):
        ended = ender.finished_at
        queued = [j for j in jobs if j.created_at <= ended and j.id in first_step and first_step[j.id] > ended]
        if queued:
            nxt = min(queued, key=lambda j: first_step[j.id])
            gaps.append((first_step[nxt.id] - ended).total_seconds())
            start_gaps.append(max((min(started[j.id] for j in queued) - ended).total_seconds(), 0.0))
            worst.append((gaps[-1], ender, nxt))
    # Exactly (not by ledger minute): each cluster's GPUs between one allocation's end and the next one's start.
    by_cluster: dict[str, list[Any]] = {}
    for alloc in allocations:
        by_cluster.setdefault(alloc.cluster_id, []).append(alloc)
    exact_drain = 0.0
    for cluster_id, allocs in by_cluster.items():
        for before, after in itertools.pairwise(allocs):
            if before.ended_at is not None and after.started_at > before.ended_at:
                exact_drain += cluster_gpus[cluster_id] * (after.started_at - before.ended_at).total_seconds() / 3600
    gpu_hours = sum(g * sec for _, g, sec, _ in ledger) / 3600
    drain = sum(g * sec for u, g, sec, _ in ledger if u == "queue_drain") / 3600
    finished = {j.id: j.finished_at for j in jobs if j.state == "SUCCEEDED" and j.finished_at}
    per_source: dict[str, dict[str, list[float]]] = {}
    for p in predictions:
        end = finished.get(p.job_id)
        if end is None:
            continue
        left = max((end - p.made_at).total_seconds(), 1.0)
        off = abs((p.finish_at - end).total_seconds())
        per_source.setdefault(p.source, {}).setdefault(p.job_id, []).append((off / left, off))
    errors = {source: (statistics.median(statistics.median(f for f, _ in v) for v in by_job.values()),
                       statistics.median(statistics.median(s for _, s in v) for v in by_job.values()), len(by_job))
              for source, by_job in per_source.items()}
    return {
        "succeeded": sum(j.state == "SUCCEEDED" for j in jobs), "jobs": len(jobs),
        "gap_median": statistics.median(gaps) if gaps else float("nan"),
        "gap_p95": _quantile(gaps, 0.95) if gaps else float("nan"), "gaps": len(gaps),
        "start_median": statistics.median(start_gaps) if start_gaps else float("nan"),
        "drain_gpu_h": drain, "drain_pct": 100 * drain / gpu_hours if gpu_hours else 0.0,
        "exact_drain_pct": 100 * exact_drain / gpu_hours if gpu_hours else 0.0,
        "gpu_h": gpu_hours, "cost": sum(c for *_, c in ledger), "errors": errors,
        "worst": [_explain(engine, gap, ender, nxt, allocations) for gap, ender, nxt in sorted(
            worst, key=lambda w: -w[0])[:3]],
    }


def _explain(engine: Any, gap: float, ender: Any, nxt: Any, allocations: list[Any]) -> str:
    """One gap in a line: the job that ended, the one whose first step closed the gap, and how that one got its GPUs."""
    from sqlalchemy import select

    from broker.store.tables import JobEventRow, JobRow

    where = {a.job_id: a.cluster_id for a in allocations}
    end = ender.finished_at
    with engine.store.transaction() as s:
        events = [e for e in s.scalars(select(JobEventRow).where(JobEventRow.job_id == nxt.id)
                                       .order_by(JobEventRow.id)) if e.kind != "transition"]
        kinds = [e.kind for e in events]
        # Times from the end that opened the gap (market s): when the next job reserved, behind whom, when
        # that job was predicted to finish (high end) and when it did.
        held = []
        for e in events:
            if e.kind not in ("eager_reserve", "eager_give_up"):
                continue
            holder = s.get(JobRow, e.detail.get("after_job"))
            done = holder.finished_at if holder is not None else None
            offsets = {"at": e.at, "predicted": e.detail.get("predicted_finish"),
                       "high": e.detail.get("predicted_high"), "ended": done}
            said = " ".join(f"{k} {(datetime.fromisoformat(str(v)) - end).total_seconds():+.0f}"
                            for k, v in offsets.items() if v is not None)
            held.append(f"{e.kind.removeprefix('eager_')} behind {holder.name if holder else '?'}: {said}")
    return (f"{gap:6.1f} s: {ender.name} ({ender.num_nodes} node) ended on {where.get(ender.id)}; next first step "
            f"{nxt.name} ({nxt.num_nodes} node) on {where.get(nxt.id)}; its events {' '.join(dict.fromkeys(kinds))}"
            + "".join(f"\n      {h}" for h in held))


def _quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    position = q * (len(ordered) - 1)
    low = int(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--jobs", type=int, default=20)
    parser.add_argument("--speed", type=float, default=10.0, help="market seconds per wall second")
    parser.add_argument("--step-seconds", type=float, default=0.1, help="wall seconds per training step")
    parser.add_argument("--timeout", type=float, default=1800.0, help="wall seconds per run")
    parser.add_argument("--setup-seconds", type=float, default=1.0,
                        help="wall seconds of each job's setup (a sleep standing for installing its dependencies)")
    parser.add_argument("--explain", action="store_true", help="print the three longest gaps of each run")
    args = parser.parse_args()
    logging.disable(logging.INFO)  # the engine's transitions; the figures are what this prints
    if not 1 <= args.jobs <= 200 or not 1 <= args.speed <= 120 or not 0.01 <= args.step_seconds <= 1 \
            or not 0 <= args.setup_seconds <= 60:
        parser.error("--jobs must be 1-200, --speed 1-120, --step-seconds 0.01-1, --setup-seconds 0-60")
    jobs = workload(args.jobs, args.step_seconds, args.speed, args.setup_seconds)
    results = {policy: run(policy, jobs, args.speed, args.timeout) for policy in ("off", "eager")}
    print(f"{args.jobs} jobs (1 and 2 nodes of 4 V100, setup {args.setup_seconds:g} wall s), pool of 16 GPUs, "
          f"market x{args.speed:g}; gaps and errors in market seconds")
    print(f"{'eager':6} {'done':>5} {'gaps':>5} {'gap med s':>10} {'gap p95 s':>10} {'to start':>9} "
          f"{'drain GPU-h':>12} {'drain %':>8} {'exact %':>8} {'GPU-h':>7} {'cost $':>8} {'wall s':>7}  "
          "prediction error: median % of time left, s (jobs)")
    for policy, r in results.items():
        errors = ", ".join(f"{src} {100 * e:.0f}% {s:.0f} s ({n})" for src, (e, s, n) in sorted(r["errors"].items()))
        print(f"{policy:6} {r['succeeded']:>2}/{r['jobs']:<2} {r['gaps']:>5} {r['gap_median']:>10.1f} "
              f"{r['gap_p95']:>10.1f} {r['start_median']:>9.1f} {r['drain_gpu_h']:>12.3f} {r['drain_pct']:>8.2f} "
              f"{r['exact_drain_pct']:>8.2f} {r['gpu_h']:>7.2f} {r['cost']:>8.3f} {r['wall_s']:>7.0f}  {errors or '-'}")
    if args.explain:
        for policy, r in results.items():
            print(f"{policy}: longest gaps\n  " + "\n  ".join(r["worst"]))
    off, on = results["off"], results["eager"]
    print(f"eager vs off: gap median {on['gap_median'] - off['gap_median']:+.1f} s, queue drain "
          f"{on['drain_pct'] - off['drain_pct']:+.2f} points, cost {100 * (on['cost'] / off['cost'] - 1):+.1f}%")


if __name__ == "__main__":
    main()
