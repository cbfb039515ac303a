"""The embedded engine ``kill -9``-ed at eleven moments of the quickstart's life, its preemption
included, then started again: every run ends SUCCEEDED, losing no more work than a run never killed
(measured in the same test, beside them) plus one checkpoint interval, and every attempt resumes from
the newest checkpoint on disk (or one the notice made in its last two market minutes).

Each moment is a phase of the run, seen from outside (a file the node writes, the job's state in the
store) and a delay after it drawn from a seeded generator; the engine stays dead a drawn while too.
The seed (``KILL_SEED``, or ``BROKER_TEST_KILL_SEED``) and every drawn moment are printed. The runs go
side by side, each in a home of its own: the quickstart is mostly its paced steps' sleep, and a phase
is waited on, never timed, so a loaded machine only makes it slower.

The preemption is the local cloud's interrupt (a notice at once and the nodes gone two market minutes
later, as AWS FIS sends), asked for two seconds after the first attempt's first checkpoint, in a
market whose trace takes no capacity: the bundled market's preemption comes twenty market minutes
(twenty seconds) after the launch, which a loaded machine reaches before the job has started.
"""

from __future__ import annotations

import json
import os
import random
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from contextlib import closing, suppress
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from broker.agent.checkpoint import latest_checkpoint
from broker.cli.engine import engine_alive
from tests.broker.job.test_examples import steady_market

ROOT = Path(__file__).resolve().parents[4]
KILL_SEED = int(os.environ.get("BROKER_TEST_KILL_SEED", "34"))
# The quickstart checkpoints every 100 steps of 0.1 s, on a market clock 60 times the wall's.
CHECKPOINT_INTERVAL_S = 100 * 0.1 * 60.0
PHASE_TIMEOUT_S = 300.0  # waiting for a phase; a loaded 2-core machine is slow, never this slow
STAGGER_S = 1.5  # between launches, so that eleven Python start-ups do not land at once


def _broker(home: Path, *args: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "broker", *args], cwd=ROOT / "examples",
                          env={**os.environ, "BROKER_HOME": str(home)}, capture_output=True, text=True,
                          timeout=timeout)


def _events(node: Path | None) -> list[dict[str, object]]:
    if node is None:
        return []
    try:
        return [json.loads(line) for line in (node / "status.events").read_text().splitlines()]
    except (OSError, ValueError):
        return []


def _seen(node: Path | None, event: str) -> bool:
    return any(e["event"] == event for e in _events(node))


def _node(home: Path, job: str, attempt: int) -> Path | None:
    found = sorted((home / "local" / "clusters").glob(f"*/runs/{job}-{attempt}/node-0"))
    return found[0] if found else None


def _job_state(home: Path, job: str) -> str | None:
    try:
        with closing(sqlite3.connect(f"file:{home / 'broker.db'}?mode=ro", uri=True, timeout=10)) as db:
            row = db.execute("SELECT state FROM jobs WHERE id = ?", (job,)).fetchone()
    except sqlite3.Error:
        return None
    return str(row[0]) if row else None


INTERRUPT_AFTER_S = 2.0  # after the first attempt's first checkpoint, the market's interrupt
NOTICE_WALL_S = 2.0  # from a notice to the nodes' end: two market minutes at 60 market seconds a second


def _first(run: Run, attempt: int) -> Path | None:
    return _node(run.home, run.job, attempt)


def _checkpointed(run: Run, step: int) -> bool:
    """A checkpoint of ``step`` or later is complete on disk (whether or not an engine heard of it)."""
    mark = latest_checkpoint(run.home / "checkpoints" / run.job)
    return mark is not None and mark.step is not None and mark.step >= step


# Phase name, what shows it has begun, and the most the kill waits after it (s).
PHASES: list[tuple[str, Callable[[Run], bool], float]] = [
    ("before start", lambda run: True, 0.3),
    ("provisioning", lambda run: any((run.home / "local" / "clusters").glob(f"{run.job}-c*")), 1.5),
    ("running", lambda run: _seen(_first(run, 1), "started"), 4.0),
    ("checkpointing", lambda run: _checkpointed(run, 100), 0.3),
    # The drawn delay puts the kill within the 1.5 s before the interrupt.
    ("just before the notice", lambda run: run.interrupt_at is not None
     and time.time() >= run.interrupt_at - 1.5, 1.4),
    ("just after the notice", lambda run: _seen(_first(run, 1), "notice_seen"), 0.3),
    ("checkpointing on the notice", lambda run: _job_state(run.home, run.job) in ("CHECKPOINTING", "MIGRATING")
     or _first(run, 2) is not None, 0.2),
    ("migrating", lambda run: _job_state(run.home, run.job) == "MIGRATING" or _first(run, 2) is not None, 0.5),
    ("resuming", lambda run: any((run.home / "local" / "clusters").glob(f"{run.job}-c2")), 1.5),
    ("running again", lambda run: _seen(_first(run, 2), "started"), 3.0),
    ("near the end", lambda run: _seen(_first(run, 2), "started") and _checkpointed(run, 300), 3.0),
]


@dataclass
class Run:
    home: Path
    phase: str | None  # None: never killed, the baseline
    delay: float = 0.0  # after the phase begins, until the kill
    downtime: float = 0.0  # with no engine, after the kill
    job: str = ""
    interrupt_at: float | None = None  # wall time the market's interrupt is due
    killed_in: str | None = None  # the job's state when it was killed
    error: str | None = None
    status: dict[str, object] = field(default_factory=dict)
    starts: list[dict[str, object]] = field(default_factory=list)


def _wait(what: Callable[[], bool], timeout: float = PHASE_TIMEOUT_S) -> None:
    deadline = time.monotonic() + timeout
    while not what():
        if time.monotonic() > deadline:
            raise AssertionError("timed out")
        time.sleep(0.1)


def _interrupt(run: Run) -> None:
    """The market's part: the first cluster's spot capacity taken soon after the first checkpoint."""
    _wait(lambda: _checkpointed(run, 100), timeout=900)
    run.interrupt_at = time.time() + INTERRUPT_AFTER_S
    time.sleep(INTERRUPT_AFTER_S)
    (run.home / "local" / "clusters" / f"{run.job}-c1" / "interrupt").touch()


def _drive(run: Run, predicate: Callable[[Run], bool] | None, market: Path) -> None:
    # The job id is read as soon as it is printed: the command takes a while longer to exit on a loaded
    # machine, while the engine it started runs the job.
    errors = run.home.with_suffix(".launch.err")
    with errors.open("w") as stderr:
        launch = subprocess.Popen([sys.executable, "-m", "broker", "launch", "quickstart.yaml", "--detach", "--json"],
                                  cwd=ROOT / "examples", env={**os.environ, "BROKER_HOME": str(run.home),
                                                              "BROKER_MARKET": str(market)},
                                  stdout=subprocess.PIPE, stderr=stderr, text=True)
    try:
        assert launch.stdout is not None
        line = launch.stdout.readline()
        assert line, errors.read_text()[-3000:]
        run.job = str(json.loads(line)["job_id"])
        threading.Thread(target=_interrupt, args=(run,), daemon=True).start()
        _kill_and_restart(run, predicate)
    finally:
        launch.communicate(timeout=600)
    assert launch.returncode == 0, errors.read_text()[-3000:]
    _wait(lambda: _job_state(run.home, run.job) not in (None, "PENDING", "PROVISIONING", "RUNNING",
                                                         "CHECKPOINTING", "MIGRATING"), timeout=600)
    shown = _broker(run.home, "status", run.job, "--json")
    assert shown.returncode == 0, shown.stderr
    run.status = json.loads(shown.stdout)
    with closing(sqlite3.connect(f"file:{run.home / 'broker.db'}?mode=ro", uri=True, timeout=10)) as db:
        run.starts = [json.loads(detail) for (detail,) in db.execute(
            "SELECT detail FROM job_events WHERE job_id = ? AND to_state = 'RUNNING' ORDER BY id", (run.job,))]


def _kill_and_restart(run: Run, predicate: Callable[[Run], bool] | None) -> None:
    if predicate is not None:
        _wait(lambda: predicate(run))
        time.sleep(run.delay)
        run.killed_in = _job_state(run.home, run.job)
        with suppress(ProcessLookupError):  # an engine done with its job before the moment came
            os.kill(int((run.home / "engine.lock").read_text().split()[0]), signal.SIGKILL)
        time.sleep(run.downtime)  # the job, its agents and the market go on without an engine
        finished = _broker(run.home, "engine", timeout=600)
        assert finished.returncode == 0, finished.stderr[-3000:]


def _started_wall(node: Path | None) -> float | None:
    return next((float(str(e["wall"])) for e in _events(node) if e["event"] == "started"), None)


def _resumed_from_newest(run: Run) -> list[str]:
    """Each attempt that did not resume from the newest checkpoint on disk when it began (the old nodes
    are gone before a new attempt starts, so nothing newer could come), or from one the notice's
    checkpoints made within its two market minutes before that: the last, written as the nodes go,
    can be cut off with them before its report, an engine killed or not."""
    wrong = []
    directory = run.home / "checkpoints" / run.job
    for start in run.starts:
        attempt = int(str(start["attempt"]))
        began = _started_wall(_node(run.home, run.job, attempt))
        before = {str(p): p.stat().st_mtime for p in directory.glob("step-*.npz")
                  if began is not None and p.stat().st_mtime < began}
        newest = max(before.values(), default=None)
        allowed = {path for path, at in before.items() if newest is not None and newest - at <= NOTICE_WALL_S}
        resumed = start.get("resume_from")
        if began is None or (resumed not in allowed if before else resumed is not None):
            wrong.append(f"attempt {attempt} resumed from {resumed}, newest before it {sorted(allowed)}")
    return wrong


@pytest.mark.slow
@pytest.mark.timeout(1500)  # twelve quickstarts side by side, 2 cores: 3.5 min at load 8-17, 5 min at 15-24
def test_an_engine_killed_at_any_moment_loses_no_more_than_an_uninterrupted_run_plus_one_interval(
        broker_home: Path, tmp_path: Path) -> None:
    draw = random.Random(KILL_SEED)
    runs = [Run(tmp_path / "uninterrupted", None)]
    for index, (phase, _, longest) in enumerate(PHASES):
        runs.append(Run(tmp_path / f"kill-{index:02d}", phase, round(draw.uniform(0.0, longest), 2),
                        round(draw.uniform(0.5, 4.0), 2)))
    predicates = {phase: predicate for phase, predicate, _ in PHASES}
    market = steady_market(tmp_path / "steady-market.csv")

    def one(run: Run) -> None:
        try:
            _drive(run, predicates[run.phase] if run.phase is not None else None, market)
        except BaseException as exc:  # reported below, with every other run's outcome
            run.error = f"{type(exc).__name__}: {exc}"

    threads = []
    try:
        for run in runs:
            thread = threading.Thread(target=one, args=(run,), daemon=True)
            thread.start()
            threads.append(thread)
            time.sleep(STAGGER_S)
        for thread in threads:
            thread.join(timeout=1200)
    finally:  # a run cut short leaves its engine and clusters up: stop them as a user would
        for run in runs:
            if engine_alive(run.home):
                with suppress(ProcessLookupError, ValueError, OSError):
                    os.kill(int((run.home / "engine.lock").read_text().split()[0]), signal.SIGKILL)
        for cluster in tmp_path.glob("*/local/clusters/*/"):
            (cluster / "terminate").touch()

    base = runs[0]
    assert base.error is None and base.status.get("state") == "SUCCEEDED", (base.error, base.status)
    bound = float(str(base.status["work_lost_seconds"])) + CHECKPOINT_INTERVAL_S
    print(f"\nkill seed {KILL_SEED}; uninterrupted: {base.status['work_lost_seconds']} s lost, "
          f"{base.status['preemptions']} preemption(s); bound {bound:.1f} s")
    for run in runs[1:]:
        print(f"  {run.phase:28} +{run.delay:4.2f} s, killed in {run.killed_in or '-':13} down {run.downtime:4.2f} s: "
              f"{run.status.get('state', run.error)}, {run.status.get('work_lost_seconds')} s lost, "
              f"{len(run.starts)} attempt(s)")
    failures = []
    for run in runs[1:]:
        if run.error is not None:
            failures.append(f"{run.phase}: {run.error}")
            continue
        lost = float(str(run.status["work_lost_seconds"]))
        if run.status["state"] != "SUCCEEDED" or run.status["progress"] != {"step": 400, "total": 400}:
            failures.append(f"{run.phase}: {run.status['state']} at {run.status['progress']}")
        if lost > bound:
            failures.append(f"{run.phase}: {lost} s of work lost, over {bound:.1f} s")
        failures += [f"{run.phase}: {wrong}" for wrong in _resumed_from_newest(run)]
    assert not failures, "\n".join(failures)
