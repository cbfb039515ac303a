"""Reconcile: tear down clusters the backend still runs that the store says nobody should.

Clusters that vanished without a notice are already found by the engine's every step (it asks
the provisioner about each live cluster and moves their jobs on); this pass covers the reverse:
a cluster alive in the backend whose row is gone, failed or terminated (a teardown that was
asked for before a crash but never arrived, or a store restored from a backup).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path

from broker.backends.local.host import read_json
from broker.model import LIVE_CLUSTER_STATES
from broker.store import Store
from broker.store.tables import ClusterRow

log = logging.getLogger("broker.service.reconcile")


def reconcile_local(store: Store, clusters_root: Path, check: Callable[[], None] | None = None) -> list[str]:
    """Ask every stray local cluster to terminate; returns their ids. ``check`` runs before each teardown."""
    if not clusters_root.is_dir():
        return []
    strays: list[str] = []
    for directory in sorted(p for p in clusters_root.iterdir() if (p / "cluster.json").exists()):
        status = read_json(directory / "status.json") or {}
        if status.get("state") in ("TERMINATED", "FAILED") or (directory / "terminate").exists():
            continue
        with store.transaction() as s:
            row = s.get(ClusterRow, directory.name)
            wanted = row is not None and row.state in LIVE_CLUSTER_STATES
        if not wanted:
            if check is not None:
                check()
            (directory / "terminate").touch()
            strays.append(directory.name)
            log.warning("reconcile: cluster %s runs but the store has it %s; tearing it down", directory.name,
                        row.state if row is not None else "unknown")
    return strays
