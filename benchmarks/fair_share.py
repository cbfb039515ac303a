"""Fair-share benchmark: four teams built from the Philly workloads share one fleet under the fair-share
policy and its baselines (FIFO, today's behaviour; static quotas without borrowing), in one run.

    python benchmarks/fair_share.py [--traces DIR] [--gpus N] [--seed S | --seeds S,S,...]

The trace: ``vision`` (weight 2) and ``nlp`` submit steadily over a day, ``speech`` and ``rl`` in
three seeded bursts each (``broker.sim.fair_share.philly_teams``). Printed per policy: the fleet's
utilisation, mean and p95 wait, and per team the GPU share it received against the share it was
owed over the whole replay and the worst one-hour window in which it had work waiting throughout;
then reclaims, the time from a reclaim to the owner's gang starting, and the time a reclaimed gang
lost, against the checkpoint time plus one engine step and one checkpoint interval. With ``--seeds``,
one line per seed and policy instead: utilisation, the worst window, and the reclaim bounds.
"""

from __future__ import annotations

import argparse
import math
import random
import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from broker.sim.fair_share import PHILLY_TEAMS, ReplayResult, percentile, philly_teams, replay
from broker.sim.workload import WorkloadError
from policies import kinds
from policies.fair_share import FairShareRequest, QueuedGang, Team, TeamUsage

POLICIES = ("weighted_fair_share", "fifo", "static_quota")
DEFAULT_TRACES = Path(__file__).resolve().parents[2] / "shared" / "traces"
STEP_S = 60.0
CHECKPOINT_S = 60.0
CHECKPOINT_INTERVAL_S = 1800.0


def decision_times(queued: int = 10_000, teams: int = 50, repeat: int = 5) -> None:
    """The time one decision takes on a large queue (the engine asks once a step), against FIFO's."""
    rng = random.Random(1)
    named = tuple(Team(f"t{i}", weight=rng.choice([1.0, 2.0, 3.0])) for i in range(teams))
    usage = tuple(TeamUsage(t.name, rng.randint(0, 40), rng.random() * 1e6) for t in named)
    gangs = tuple(QueuedGang(f"j{i}", f"t{rng.randrange(teams)}", rng.choice([1, 2, 4, 8]), 500, i)
                  for i in range(queued))
    request = FairShareRequest(2048, named, usage, gangs)
    cells = []
    for name in ("weighted_fair_share", "fifo"):
        policy = kinds.fair_share.get(name)
        best = math.inf
        for _ in range(repeat):
            began = time.perf_counter()
            policy(request)
            best = min(best, time.perf_counter() - began)
        cells.append(f"{name} {best * 1000:.0f} ms")
    print(f"one decision, {queued:,} queued jobs of {teams} teams on 2,048 GPUs (best of {repeat}): "
          + ", ".join(cells))


def bounded(low: int, high: int) -> Callable[[str], int]:
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a whole number, got {text[:40]!r}") from None
        if not low <= value <= high:
            raise argparse.ArgumentTypeError(f"expected {low} to {high}, got {value}")
        return value

    return parse


def seeds(text: str) -> list[int]:
    parse = bounded(0, 2**31)
    values = [parse(part) for part in text.split(",") if part.strip()]
    if not 1 <= len(values) <= 50:
        raise argparse.ArgumentTypeError(f"expected 1 to 50 seeds separated by commas, got {len(values)}")
    return values


def per_seed(traces: Path, gpus: int, chosen: list[int], first: int | None = None) -> None:
    """One line per seed and policy, every policy replayed on the same trace in this run."""
    print(f"Philly workloads 1-4 as four teams, {gpus} GPUs, step {STEP_S:.0f} s, checkpoints {CHECKPOINT_S:.0f} s; "
          f"reclaim bounds: handover {CHECKPOINT_S + STEP_S:.0f} s, lost {CHECKPOINT_INTERVAL_S:.0f} s")
    print(f"{'seed':>4} {'policy':<20}{'utilisation':>12}{'makespan h':>11}{'mean wait h':>12}{'worst window':>13}"
          f"{'reclaims':>9}{'handover s':>11}{'lost s':>7}{'unfinished':>11}")
    wins = 0
    for seed in chosen:
        jobs = philly_teams(traces, seed)[:first]
        results = [replay(jobs, PHILLY_TEAMS, gpus, kinds.fair_share.get(name), name, step_s=STEP_S,
                          checkpoint_s=CHECKPOINT_S) for name in POLICIES]
        for r in results:
            print(f"{seed:>4} {r.policy:<20}{r.utilisation:>12.1%}{r.makespan_s / 3600:>11.1f}"
                  f"{r.mean_wait_s / 3600:>12.2f}{r.worst_window_error:>13.1%}{len(r.handovers_s):>9}"
                  f"{max(r.handovers_s, default=0):>11.0f}{max(r.lost_per_reclaim_s, default=0):>7.0f}"
                  f"{r.unfinished:>11}", flush=True)
        wins += results[0].utilisation >= results[1].utilisation
    print(f"{POLICIES[0]} at least FIFO's utilisation on {wins} of {len(chosen)} seeds")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--traces", type=Path, default=DEFAULT_TRACES)
    parser.add_argument("--gpus", type=bounded(1, 100_000), default=128)
    parser.add_argument("--seed", type=bounded(0, 2**31), default=31)
    parser.add_argument("--seeds", type=seeds, default=None, help="several seeds, one line each: 1,2,3")
    parser.add_argument("--jobs", type=bounded(1, 10_000_000), default=None,
                        help="replay only the first N jobs submitted (a quick look; the figures are for all)")
    args = parser.parse_args(argv)
    if args.seeds is not None:
        try:
            per_seed(args.traces, args.gpus, args.seeds, args.jobs)
        except WorkloadError as exc:
            parser.exit(2, f"error: --traces: {exc}\n")
        return 0
    try:
        jobs = philly_teams(args.traces, args.seed)[:args.jobs]
    except WorkloadError as exc:
        parser.exit(2, f"error: --traces: {exc}\n")
    print(f"{len(jobs)} jobs of {len({j.team for j in jobs})} teams (Philly workloads 1-4, seed {args.seed}) "
          f"on {args.gpus} GPUs, a step every {STEP_S:.0f} s, checkpoints take {CHECKPOINT_S:.0f} s")
    results: list[ReplayResult] = []
    for name in POLICIES:
        began = time.perf_counter()
        result = replay(jobs, PHILLY_TEAMS, args.gpus, kinds.fair_share.get(name), name, step_s=STEP_S,
                        checkpoint_s=CHECKPOINT_S)
        results.append(result)
        print(f"  replayed {name} in {time.perf_counter() - began:.1f} s")
    print()
    print("utilisation: GPU-time held / the fleet's, from the first submission to the last finish; contended: the\n"
          "same over the steps in which a job waited")
    print(f"{'policy':<22}{'utilisation':>12}{'contended':>10}{'makespan h':>11}{'mean wait h':>12}{'p95 wait h':>11}"
          f"{'worst window':>13}{'unfinished':>11}")
    for r in results:
        waits = [w for t in r.teams.values() for w in t.waits_s]
        print(f"{r.policy:<22}{r.utilisation:>12.1%}{r.contended_utilisation:>10.1%}{r.makespan_s / 3600:>11.1f}"
              f"{r.mean_wait_s / 3600:>12.2f}"
              f"{percentile(waits, 0.95) / 3600:>11.2f}{r.worst_window_error:>13.1%}{r.unfinished:>11}")
    print()
    print("share received / owed over the replay; worst one-hour window in which the team had, throughout, work\n"
          "waiting and a share its gangs can fill: (entitled - received) / entitled, entitled being what it holds\n"
          "plus its smallest waiting gangs that fit in what it is owed; of how many such windows")
    for r in results:
        cells = []
        for team in (t.name for t in PHILLY_TEAMS):
            fig = r.teams.get(team)
            if fig is None:
                continue
            ratio = fig.received_gpu_s / fig.owed_gpu_s if fig.owed_gpu_s else 0.0
            cells.append(f"{team} {ratio:.2f} (worst {fig.worst_window_error:.0%} of {fig.windows})")
        print(f"  {r.policy:<20} " + ", ".join(cells))
    print()
    fair = results[0]
    bound = CHECKPOINT_S + STEP_S
    handover = max(fair.handovers_s, default=0)
    print(f"reclaims under {fair.policy}: {len(fair.handovers_s)}; handover at most {handover:.0f} s "
          f"(bound: checkpoint {CHECKPOINT_S:.0f} s + one step {STEP_S:.0f} s = {bound:.0f} s); "
          f"time lost per reclaimed gang at most {max(fair.lost_per_reclaim_s, default=0):.0f} s "
          f"(bound: one checkpoint interval, {CHECKPOINT_INTERVAL_S:.0f} s)")
    borrowed = sum(t.borrowed_gpu_s for t in fair.teams.values()) / 3600
    reclaimed = sum(t.reclaimed_gpu_s for t in fair.teams.values()) / 3600
    print(f"GPU-hours borrowed {borrowed:.0f}, GPU-hours lost to reclaims {reclaimed:.1f}")
    fifo = results[1]
    decision_times()
    print(f"utilisation vs FIFO: {fair.utilisation:.1%} vs {fifo.utilisation:.1%}; while jobs waited "
          f"{fair.contended_utilisation:.1%} vs {fifo.contended_utilisation:.1%}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
