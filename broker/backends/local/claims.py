"""A local node's claim and what became of it: did a process ever come, is it still there?

A start claims each node of the gang with an atomic ``mkdir`` (of two callers starting one node,
only one goes on), writes who claimed it, and launches the node's agent, recording its pid in
``started``. A broker killed (or frozen) between the claim and the launch leaves a node that no
process will ever run; an agent killed before it wrote its exit code leaves one that no process
runs any more. ``node_fate`` tells those apart from a node still starting or running, so the run
is reported ``NO_PROCESS`` within a bound instead of RUNNING forever.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from broker.backends.local.host import process_alive, read_json, write_json

CLAIM = "claim"  # who claimed the node: {"pid", "pid_start", "wall"}
GANG = "gang.json"  # how many nodes the run has, and who started it
# How long a claimer whose process is gone had to launch (python's start, under load, takes a while):
# past it, a claimed node with no sign of a process was never launched.
DEAD_CLAIMER_GRACE_S = 10.0
BURIED_PREFIX = ".abandoned-"  # a node given up: not ``node-*``, so no run counts it


def process_start(pid: int) -> str | None:
    """The process's start time in clock ticks since boot: with the pid, who it is (pids are reused)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


def identity(pid: int) -> dict[str, Any]:
    return {"pid": pid, "pid_start": process_start(pid), "wall": time.time()}


def same_process_alive(record: dict[str, Any] | None) -> bool:
    """The process a record names still runs (and is that process, not a later one with its pid)."""
    if not record or "pid" not in record or not process_alive(record["pid"]):
        return False
    recorded = record.get("pid_start")
    return recorded is None or process_start(int(record["pid"])) == recorded


def record_gang(run_dir: Path, nodes: int) -> None:
    """Written before any node is claimed: a node never claimed is then missing, not absent."""
    run_dir.mkdir(parents=True, exist_ok=True)
    if not (run_dir / GANG).exists():
        write_json(run_dir / GANG, {"nodes": nodes, **identity(os.getpid())})


def claim_node(node_dir: Path) -> bool:
    """Take the node, atomically; False when another caller has it (started, or being started)."""
    try:
        node_dir.mkdir()
    except FileExistsError:
        return False
    write_json(node_dir / CLAIM, identity(os.getpid()))
    return True


def _claim_given_up(record: dict[str, Any] | None, since: float, claim_seconds: float, now: float) -> bool:
    """No process came for a claim: its claimer is gone (and had time to launch), or it had ``claim_seconds``."""
    age = now - float((record or {}).get("wall", since))
    if age >= claim_seconds:
        return True
    return age >= DEAD_CLAIMER_GRACE_S and not same_process_alive(record)


def node_fate(node_dir: Path, claim_seconds: float, now: float | None = None,
              alive: Callable[[dict[str, Any] | None], bool] = same_process_alive) -> str | None:
    """None while the node's process starts or runs (or has reported); else why it has none, in a line.
    ``alive``: how a recorded process is looked at (``same_process_alive``, or a memo of it for many runs)."""
    now = time.time() if now is None else now
    if (node_dir / "status").exists():
        return None
    started = read_json(node_dir / "started")
    if started is not None:
        if alive(started) or (node_dir / "status").exists():  # it writes, then exits
            return None
        return "its agent stopped before it reported how the job ended"
    if (node_dir / "status.pgid").exists() or (node_dir / "status.events").exists():
        return None  # an agent runs, launched by a broker that died before it wrote ``started``
    try:
        since = node_dir.stat().st_mtime
    except FileNotFoundError:
        return None
    if _claim_given_up(read_json(node_dir / CLAIM), since, claim_seconds, now):
        return "claimed but never launched (the broker that claimed it stopped before starting its process)"
    return None


def missing_fate(run_dir: Path, nodes: list[Path], claim_seconds: float) -> str | None:
    """Why the gang's nodes no caller ever claimed will not come (its starter died between two claims)."""
    gang = read_json(run_dir / GANG)
    if gang is None or len(nodes) >= int(gang.get("nodes", 0)):
        return None
    names = {n.name for n in nodes}
    missing = next(f"node-{r}" for r in range(int(gang["nodes"])) if f"node-{r}" not in names)
    if _claim_given_up(gang, (run_dir / GANG).stat().st_mtime, claim_seconds, time.time()):
        return f"{missing}: never claimed (the broker starting the gang stopped before it)"
    return None


def bury_unlaunched(run_dir: Path, claim_seconds: float) -> None:
    """Move aside the run's nodes given up as never launched: a frozen claimer that wakes later finds
    no node directory to write or run from, so its late launch runs nothing."""
    for node_dir in run_dir.glob("node-*"):
        fate = node_fate(node_dir, claim_seconds)
        if fate is not None and not (node_dir / "started").exists():
            with contextlib.suppress(OSError):
                os.rename(node_dir, run_dir / f"{BURIED_PREFIX}{node_dir.name}-{time.time_ns()}")
