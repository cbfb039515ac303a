"""``broker engine``: the embedded engine in the foreground; and the background engine a later command restarts.

The engine of a broker home runs inside ``broker launch`` (attached), or in the background after
``broker launch --detach``. Should that one die (killed, the machine rebooted), ``status``, ``logs``
and ``cancel`` find jobs active (or clusters up) and no engine holding the home's engine lock, and
start one in the background again. ``broker engine`` is the same engine in the foreground, until
no job is active or Ctrl-C; jobs stopped that way carry on when an engine next runs.
"""

from __future__ import annotations

import fcntl
import logging
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

from broker.cli import remote
from broker.cli.app import ConfigOption, app

if TYPE_CHECKING:
    from broker.store import Store


def engine_alive(home: Path) -> bool:
    """Some process holds the home's engine lock (an engine, or a service replica on this home), or an
    engine just started in the background is about to take it."""
    path = home / "engine.lock"
    if not path.exists():
        return False
    with open(path, "a") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        fcntl.flock(handle, fcntl.LOCK_UN)
    return _starting(path)


ENGINE_LOCK_WAIT_S = 2.0  # how long a spawned engine waits for the lock its spawner is handing over
# How long after ``spawn_engine`` named it in the lock an engine still counts as starting while it lives:
# its Python starts and takes the lock within seconds, or gives up ENGINE_LOCK_WAIT_S after and exits.
ENGINE_START_GRACE_S = 120.0


def _starting(path: Path) -> bool:
    """The lock is free but names a live process, written moments ago: an engine ``spawn_engine`` handed
    the lock to (or one between taking the lock and driving), which has not taken it yet. Without
    this, a ``broker logs --follow`` right after ``broker status`` restarted the engine found no
    engine and started a second."""
    try:
        pid = int(path.read_text().split()[0])
        age = time.time() - path.stat().st_mtime
    except (OSError, ValueError, IndexError):
        return False
    if pid == os.getpid() or not 0 <= age <= ENGINE_START_GRACE_S:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # alive, another user's
    try:  # an engine that exited but its spawner, still running, has not reaped it (Linux)
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return True


def spawn_engine(config: Path | None, home: Path) -> None:
    """Start the engine in the background, detached; it exits at once if another one drives the home.

    When none does, the lock file names the new engine before this returns (``engine.lock`` holds the pid
    to signal, never a dead engine's): the lock is taken here, the child's pid written, and the lock let go
    for the child, which waits a moment for it (``ENGINE_LOCK_WAIT_S``).
    """
    from broker.runtime import EngineLock

    command = [sys.executable, "-m", "broker", "run-engine"]
    if config is not None:
        command += ["--config", str(config)]
    lock = EngineLock(home)
    free = lock.acquire()
    try:
        child = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                 stderr=subprocess.DEVNULL, start_new_session=True)
        if free:
            lock.hand_over(child.pid)
    finally:
        lock.release()


def broker_home(config: Path | None) -> Path:
    """The broker home as the settings give it, reading the whole settings model only when a file says something."""
    from broker.config.file import check_home

    if remote.read_settings_file(config):
        from broker.config.settings import load_settings

        return load_settings(config).home
    home = os.environ.get("BROKER_HOME")
    return check_home(Path(home)) if home else Path.home() / ".broker"


def unattended(store: Store) -> tuple[int, int]:
    """(active jobs, live clusters) of a store no service has led: what a dead embedded engine left behind."""
    from sqlalchemy import func, select

    from broker.model import ACTIVE_STATES, LIVE_CLUSTER_STATES
    from broker.store.tables import ClusterRow, JobRow, LeaderLeaseRow

    with store.transaction() as s:
        if s.scalar(select(func.max(LeaderLeaseRow.epoch))):
            return 0, 0  # `broker serve` leads this store: its replicas run the engine, never the CLI
        jobs = s.scalar(select(func.count()).select_from(JobRow).where(JobRow.state.in_(ACTIVE_STATES)))
        clusters = s.scalar(select(func.count()).select_from(ClusterRow)
                            .where(ClusterRow.state.in_(LIVE_CLUSTER_STATES)))
    return int(jobs or 0), int(clusters or 0)


def revive(config: Path | None, store: Store) -> None:
    """Restart the background engine when jobs are active (or clusters up) and no engine drives the home."""
    revive_if(config, *unattended(store))


def revive_if(config: Path | None, jobs: int, clusters: int) -> None:
    """``revive`` given what ``unattended`` found (``broker.status.readonly`` counts them without SQLAlchemy)."""
    if not (jobs or clusters):
        return
    home = broker_home(config)
    if engine_alive(home):
        return
    spawn_engine(config, home)
    from broker.cli.app import err_console

    err_console.print(f"no engine was running for {jobs} active job(s) and {clusters} live cluster(s): started one "
                      "in the background (`broker engine` runs it in the foreground)", highlight=False, markup=False)


@app.command("engine")
def engine(config: ConfigOption = None) -> None:
    """Run the engine in the foreground until no job is active; Ctrl-C stops it, and its jobs wait for the next."""
    drive_home(config, foreground=True)


@app.command("run-engine", hidden=True)
def run_engine(config: ConfigOption = None) -> None:
    """Drive the engine until no job is active (what `launch --detach` leaves running), saying nothing."""
    drive_home(config, foreground=False)


def drive_home(config: Path | None, foreground: bool) -> None:
    """The engine of the settings' broker home until no job is active, unless another one drives it.
    ``foreground`` (``broker engine``): every transition logged, and a Ctrl-C leaves the jobs for the next."""
    from broker.cli.app import err_console
    from broker.cli.driving import drive
    from broker.config.settings import load_settings
    from broker.engine.machine import active_job_count
    from broker.runtime import EngineLock, assemble

    settings = load_settings(config)
    lock = EngineLock(settings.home)
    # The one that spawned it holds the lock an instant (to write this pid in it): wait that out.
    if not lock.acquire(wait_s=0.0 if foreground else ENGINE_LOCK_WAIT_S):
        holder = lock.holder()
        if foreground:
            err_console.print(f"an engine already drives {settings.home}" + (f" (pid {holder})" if holder else "")
                              + ": nothing to do", highlight=False, markup=False)
        return
    lock.release()  # drive() takes it again, for as long as it runs
    if foreground:
        logging.getLogger("broker.engine").setLevel(logging.INFO)  # every transition, as it happens
    runtime = assemble(settings)
    try:
        if foreground:
            err_console.print(f"engine: driving {active_job_count(runtime.store)} active job(s) in {settings.home}; "
                              "Ctrl-C stops it", highlight=False, markup=False)
        drive(runtime, settings, None, show=False)
    except KeyboardInterrupt:
        if not foreground:
            raise
        left = active_job_count(runtime.store)
        err_console.print(f"engine stopped: {left} job(s) still active; `broker engine` (or `broker status`) "
                          "carries on with them", highlight=False, markup=False)
        raise SystemExit(130) from None
    finally:
        runtime.close()
    if foreground:
        err_console.print("engine: no active job left; stopped", highlight=False, markup=False)
