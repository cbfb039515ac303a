"""What an earlier look at a cluster's or a run's files found, kept while their directories stay unchanged.

A step asks the status of every live cluster and every running run; on a fleet in which nothing
changed, reading each one's files again (a run's node directories, its ``status``, ``started`` and
``gang.json``; a cluster's ``status.json``) is most of what a step costs. Every file these looks
read is created once or replaced whole (written aside, then renamed into place), and either
changes its directory's modification time, so an unchanged directory means unchanged files. What
still changes without touching a file is kept out: the processes are looked at on every call, and
a directory changed within ``SETTLE_NS`` of a look is not trusted (two changes inside a file
system's timestamp resolution can leave the same time).

This is only a cache: a look that finds anything else reads the files as before.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from broker.backends.base import ClusterInfo, ClusterStatus
from broker.backends.local.claims import same_process_alive
from broker.backends.local.host import read_json

SETTLE_NS = 1_000_000_000  # a directory changed this recently before a look is read again next time


def mtime_ns(path: Path) -> int | None:
    try:
        return os.stat(path).st_mtime_ns
    except OSError:
        return None


def settled(mtime: int | None, looked_ns: int) -> bool:
    return mtime is not None and mtime < looked_ns - SETTLE_NS


@dataclass(frozen=True, slots=True)
class SteadyRun:
    """A run found running: its directory's and each node directory's modification time, and each node's
    process record (``started``), all read before the look that found it running."""

    mtime: int
    nodes: tuple[tuple[Path, int], ...]
    processes: tuple[dict[str, Any], ...]


class Steady:
    """Per provisioner: runs found running, and clusters' status files, by their directories' times."""

    def __init__(self) -> None:
        self._runs: dict[tuple[str, str, int], SteadyRun] = {}
        self._statuses: dict[Path, tuple[int, dict[str, Any] | None]] = {}

    def run(self, key: tuple[str, str, int], base: Path) -> SteadyRun | None:
        """The run as last found running, if none of its directories changed since."""
        seen = self._runs.get(key)
        if seen is None:
            return None
        if mtime_ns(base) != seen.mtime or any(mtime_ns(node) != mtime for node, mtime in seen.nodes):
            self._runs.pop(key, None)
            return None
        return seen

    @staticmethod
    def before(base: Path) -> tuple[int, int | None]:
        """What a look records before it reads a run's files: when, and the run directory's time."""
        return time.time_ns(), mtime_ns(base)

    def running(self, key: tuple[str, str, int], base: Path, nodes: list[Path], before: tuple[int, int | None],
                node_times: list[int | None]) -> None:
        """A look found the run running: kept if its directories had settled before the look, each node has
        its process record and the run has all its nodes (else the next look reads its files again)."""
        looked, mtime = before
        if not settled(mtime, looked) or not all(settled(t, looked) for t in node_times):
            self._runs.pop(key, None)
            return
        processes = [read_json(node / "started") for node in nodes]
        gang = read_json(base / "gang.json")
        if any(p is None for p in processes) or (gang is not None and len(nodes) < int(gang.get("nodes", 0))):
            self._runs.pop(key, None)
            return
        assert mtime is not None
        self._runs[key] = SteadyRun(mtime, tuple((n, t) for n, t in zip(nodes, node_times, strict=True)
                                                 if t is not None),
                                    tuple(p for p in processes if p is not None))

    def forget(self, key: tuple[str, str, int]) -> None:
        self._runs.pop(key, None)

    def keep_only(self, keys: set[tuple[str, str, int]]) -> None:
        """Drop the runs not asked of in a call that asked of every running one (ended or moved runs)."""
        for key in [k for k in self._runs if k not in keys]:
            self._runs.pop(key, None)

    def keep_statuses(self, directories: set[Path]) -> None:
        """Drop the clusters not asked of in a call that asked of every live one."""
        for directory in [d for d in self._statuses if d not in directories]:
            self._statuses.pop(directory, None)

    def status_file(self, directory: Path) -> tuple[bool, dict[str, Any] | None]:
        """(whether ``cluster.json`` exists, ``status.json`` as read) of a cluster's directory, read again
        only once the directory changed."""
        looked, mtime = time.time_ns(), mtime_ns(directory)
        seen = self._statuses.get(directory)
        if seen is not None and mtime is not None and seen[0] == mtime:
            return True, seen[1]
        if not (directory / "cluster.json").exists():
            self._statuses.pop(directory, None)
            return False, None
        data = read_json(directory / "status.json")
        if settled(mtime, looked) and data is not None:
            assert mtime is not None
            self._statuses[directory] = (mtime, data)
        else:
            self._statuses.pop(directory, None)
        return True, data


class Look:
    """What one call has already looked at: each cluster's status and each recorded process's life.
    ``status``: the provisioner's look at one cluster, given the host pids looked at already."""

    def __init__(self, status: Callable[[ClusterInfo, dict[int, bool]], ClusterStatus]) -> None:
        self._status = status
        self.clusters: dict[str, ClusterStatus] = {}
        self.hosts: dict[int, bool] = {}  # host pid -> alive
        self.processes: dict[tuple[object, object], bool] = {}  # (pid, its start) -> the same process runs

    def status(self, cluster: ClusterInfo) -> ClusterStatus:
        if cluster.id not in self.clusters:
            self.clusters[cluster.id] = self._status(cluster, self.hosts)
        return self.clusters[cluster.id]

    def same_process_alive(self, record: dict[str, Any] | None) -> bool:
        if not record or "pid" not in record:
            return False
        key = (record["pid"], record.get("pid_start"))
        if key not in self.processes:
            self.processes[key] = same_process_alive(record)
        return self.processes[key]
