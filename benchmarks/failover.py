"""Failover under faults: `broker serve` replicas on PostgreSQL, their leader killed, frozen or stopped.

    python benchmarks/failover.py [--postgres URL] [--kills 20] [--jobs 6] [--steps 200] [--seed 22]
                                  [--chaos-steps 1000] [--replicas 3] [--only baseline|chaos|freeze|stop]
                                  [--keep-logs DIR]

Four runs of the local backend on a two-zone V100 market whose cheap zone loses its capacity for
15 minutes in every 45 (at 60x, 15 s in every 45: jobs are preempted and migrate all through a
run), each on a fresh database and broker home:

- baseline: two replicas run a queue of ``--jobs`` jobs with no fault;
- chaos: three replicas; the leader is SIGKILLed at ``--kills`` random moments (and restarted),
  jobs of ``--chaos-steps`` steps (50 s: longer than the market's cycle, so preempted) submitted
  to keep three active, until every kill is done and every job has finished;
- freeze: the leader is SIGSTOPped mid-run, another takes over, then the frozen one is SIGCONTed;
- stop: the leader gets SIGTERM mid-run.

Each prints its counts: kills, takeovers and their times, jobs finished, and what must be zero:
ledger minutes outside their cluster's life, engine writes a database trigger saw from an epoch
after its lease was released or taken over, job processes started twice, clusters left up.
Settings: chaos uses ``leader_check_seconds`` 1 (a 5 s lease); freeze and stop the default 3
(a 15 s lease). Took 24 minutes on a shared 2-core machine at load average 19.
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import signal
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import psycopg

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.broker.service.replicas import (  # noqa: E402
    FaultRun,
    Fleet,
    audited_writes,
    chaos,
    flapping_trace,
    lease_changes,
    run_queue,
    wait_for,
)


@contextmanager
def fleet(server: str, keep: Path | None, label: str, **settings: str) -> Iterator[Fleet]:
    name = f"broker_failover_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(server, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    try:
        with tempfile.TemporaryDirectory(prefix="failover-") as tmp:
            directory = Path(tmp)
            market = flapping_trace(directory / "market.csv")
            running = Fleet(directory, directory / "home", f"{server.rsplit('/', 1)[0]}/{name}", market, **settings)
            try:
                yield running
            finally:
                running.close()
                if keep is not None:  # the replicas' logs, for reading afterwards
                    (keep / label).mkdir(parents=True, exist_ok=True)
                    for log in directory.glob("r*.log"):
                        shutil.copy(log, keep / label / log.name)
    finally:
        with psycopg.connect(server, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def epoch_of(lines: list[dict[str, object]]) -> int:
    return max(int(str(line["epoch"])) for line in lines if line.get("event") == "leader_acquired")


def fault(running: Fleet, jobs: int, steps: int, kind: str, sig: signal.Signals) -> FaultRun:
    """One leader hit by ``sig`` once a job runs; for SIGSTOP, woken once another replica leads."""
    run = FaultRun(kind)
    began = time.time()
    old = running.leader()
    for _ in range(jobs):
        running.submit(steps)
    wait_for(lambda: "RUNNING" in running.states().values() or None, 120, "a job to run")
    old.process.send_signal(sig)
    hit = time.time()
    run.kills = 1
    new = running.leader(timeout=60)
    run.takeovers.append(time.time() - hit)
    if sig is signal.SIGSTOP:
        time.sleep(2)
        old.process.send_signal(signal.SIGCONT)
    states = running.wait_finished(400)
    run.seconds = time.time() - began
    run.jobs = len(states)
    run.finished = _count(states.values())
    run.checks = running.check()
    old_epoch, new_epoch = epoch_of(old.lines()), epoch_of(new.lines())
    writes = audited_writes(running.postgres_url)
    _, ended = lease_changes(writes)[old_epoch]
    run.checks["old_epoch_writes_before_end"] = sum(
        1 for w in writes if w.epoch == old_epoch and w.tbl != "leader_lease" and ended and w.ts < ended)
    run.checks["epochs"] = f"{old_epoch} -> {new_epoch}"
    return run


def _count(states: object) -> dict[str, int]:
    counts: dict[str, int] = {}
    for state in states:  # type: ignore[attr-defined]
        counts[state] = counts.get(state, 0) + 1
    return counts


def report(run: FaultRun, baseline: FaultRun | None = None) -> None:
    checks = run.checks
    times = run.takeovers
    line = f"{run.kind:<9} kills {run.kills:>2}  takeovers {len(times):>2}"
    if times:
        line += (f" in {min(times):.1f}/{statistics.median(times):.1f}/{max(times):.1f} s (min/median/max)")
    print(line)
    print(f"          jobs finished {run.finished} of {run.jobs} in {run.seconds:.0f} s"
          + (f" ({run.seconds / baseline.seconds * baseline.jobs / max(run.jobs, 1):.2f}x the baseline's"
             " seconds per job)" if baseline else ""))
    print(f"          ledger violations: {len(checks['ledger_violations'])}, writes after the lease ended:"
          f" {len(checks['late_writes'])}, jobs started twice: {checks['jobs_started_twice']},"
          f" clusters without a row: {checks['clusters_without_row']}, clusters left up: {checks['clusters_left_up']}")
    print(f"          clusters {checks['clusters']}, attempts {checks['attempts']}, ledger rows {checks['ledger_rows']}"
          + (f", epochs {checks['epochs']}, the old epoch's writes before its end: "
             f"{checks['old_epoch_writes_before_end']}" if "epochs" in checks else ""))
    for violation in checks["ledger_violations"][:5]:
        print(f"          ledger: {violation}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--postgres", default=os.environ.get("BROKER_TEST_POSTGRES",
                                                             "postgresql://postgres@127.0.0.1:5432/postgres"))
    parser.add_argument("--kills", type=int, default=20)
    parser.add_argument("--jobs", type=int, default=6)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--chaos-steps", type=int, default=1000,
                        help="steps of a chaos job: 50 s of training outlasts the market's 45 s cycle, so a job on "
                             "the cheap zone meets its capacity loss while the leader is being killed")
    parser.add_argument("--seed", type=int, default=22)
    parser.add_argument("--keep-logs", type=Path, help="copy each run's replica logs under this directory")
    parser.add_argument("--replicas", type=int, default=3, help="replicas in the chaos run (killed ones restart)")
    parser.add_argument("--only", choices=["baseline", "chaos", "freeze", "stop"], action="append")
    args = parser.parse_args()
    wanted = set(args.only or ["baseline", "chaos", "freeze", "stop"])
    runs: dict[str, Callable[[], FaultRun]] = {
        "baseline": lambda: _with(args, "baseline", lambda f: run_queue(f, args.jobs, args.steps), 2),
        "chaos": lambda: _with(args, "chaos",
                               lambda f: chaos(f, args.kills, random.Random(args.seed), steps=args.chaos_steps),
                               args.replicas, BROKER_LEADER_CHECK_SECONDS="1"),
        "freeze": lambda: _with(args, "freeze",
                                lambda f: fault(f, args.jobs, args.steps, "sigstop", signal.SIGSTOP), 2),
        "stop": lambda: _with(args, "stop", lambda f: fault(f, args.jobs, args.steps, "sigterm", signal.SIGTERM), 2),
    }
    print(f"broker serve replicas on PostgreSQL, local backend, a two-zone market whose cheap zone loses its"
          f" capacity 15 minutes in every 45; {args.jobs} jobs of {args.steps} steps (chaos: kept 3 active)")
    baseline = None
    failed = False
    for name in ("baseline", "chaos", "freeze", "stop"):
        if name not in wanted:
            continue
        run = runs[name]()
        report(run, baseline if name != "baseline" else None)
        if name == "baseline":
            baseline = run
        failed |= bool(run.checks["ledger_violations"] or run.checks["late_writes"] or run.checks["jobs_started_twice"]
                       or run.checks["clusters_left_up"] or run.finished != {"SUCCEEDED": run.jobs})
    sys.exit(1 if failed else 0)


def _with(args: argparse.Namespace, label: str, body: Callable[[Fleet], FaultRun], replicas: int,
          **settings: str) -> FaultRun:
    with fleet(args.postgres, args.keep_logs, label, **settings) as running:
        running.start(replicas)
        return body(running)


if __name__ == "__main__":
    main()
