"""What every sharing policy shares: the nodes a task fits on, picking among them, and its GPUs there.

A policy asks ``candidates`` for the nodes that fit (every hard rule is checked there, once), scores
them, and lets ``Candidates.best`` pick the best (ties at random with the request's seed, as the
Kubernetes scheduler breaks them) and give the task its GPUs on that node: for a fraction the
fitting GPU with the least share left, for a gang of whole GPUs the free ones with the tightest
links where the node's topology is known.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from policies.sharing_model import SHARING_POLICIES, SharingCluster, SharingPlacement, SharingRequest, TaskShape

Policy = Callable[[SharingRequest, SharingCluster], SharingPlacement | None]


def _gpu_fits(task: TaskShape, cluster: SharingCluster) -> Any:
    """``nodes x GPUs`` boolean: this GPU can take one share of the task."""
    return (cluster.gpu_left >= task.gpu_milli) & (cluster.gpu_mem_left >= task.gpu_memory_mib)


def feasible(task: TaskShape, cluster: SharingCluster) -> tuple[Any, Any]:
    """(nodes the task fits on, ``nodes x GPUs`` fitting GPUs or None for a CPU-only task)."""
    ok = (cluster.cpu_left >= task.cpu_milli) & (cluster.mem_left >= task.memory_mib)
    if not task.gpus:
        return ok, None
    fits = _gpu_fits(task, cluster)
    ok &= cluster.allowed_models(task) & (fits.sum(axis=1) >= task.gpus)
    return ok, fits


def pick(rng: Any, among: Any) -> int:
    """One of ``among`` at random (the only one without drawing)."""
    return int(among[int(rng.integers(len(among)))]) if len(among) > 1 else int(among[0])


def best_index(score: Any, rng: Any, maximise: bool = True) -> int:
    """Index of the best score, ties broken at random."""
    import numpy as np

    best = np.max(score) if maximise else np.min(score)
    return pick(rng, np.flatnonzero(score == best))


@lru_cache(maxsize=4096)
def _tightest(instance_type: str, free: tuple[int, ...], k: int) -> tuple[int, ...]:
    """The ``k`` of the ``free`` GPUs whose ring has the fastest slowest link (then lowest indices)."""
    from providers.topology import UnknownInstanceType, ring_bandwidth_gb_s, topology

    try:
        topo = topology(instance_type)
    except UnknownInstanceType:
        return free[:k]
    if topo.gpus < max(free) + 1:
        return free[:k]
    best: tuple[int, ...] = free[:k]
    best_bw = -1.0
    for n, combo in enumerate(itertools.combinations(free, k)):
        if n >= 512:  # more subsets than an 8-GPU node has: keep what was found
            break
        bw = ring_bandwidth_gb_s(topo, combo)
        if bw > best_bw:
            best, best_bw = combo, bw
    return best


@dataclass(frozen=True, eq=False)
class Candidates:
    """The nodes a task fits on (``nodes``, indices into the cluster) and its fitting GPUs."""

    task: TaskShape
    cluster: SharingCluster
    nodes: Any
    fits: Any  # nodes x GPUs, or None for a CPU-only task
    rng: Any

    def place(self, node: int, gpu: int | None = None) -> SharingPlacement:
        """The task on ``node``: on ``gpu`` if given, else the GPUs ``Candidates`` would give it there."""
        task, cluster = self.task, self.cluster
        if not task.gpus:
            return SharingPlacement(node, (), 0)
        if task.is_fraction:
            return SharingPlacement(node, (self.tightest_gpu(node) if gpu is None else gpu,), task.gpu_milli)
        free = tuple(int(g) for g in range(cluster.nodes[node].gpus) if self.fits[node, g])
        instance_type = cluster.nodes[node].instance_type
        chosen = _tightest(instance_type, free, task.gpus) if task.gpus > 1 and instance_type else free[:task.gpus]
        return SharingPlacement(node, chosen, task.gpu_milli)

    def tightest_gpu(self, node: int) -> int:
        """The fitting GPU of ``node`` with the least share left (lowest index on ties)."""
        import numpy as np

        left = np.where(self.fits[node], self.cluster.gpu_left[node], np.iinfo(np.int64).max)
        return int(np.argmin(left))

    def best(self, score: Any, maximise: bool = True) -> SharingPlacement:
        """The task on the candidate node with the best ``score`` (one per candidate; ties at random)."""
        return self.place(int(self.nodes[best_index(score, self.rng, maximise)]))

    def any(self) -> SharingPlacement:
        return self.place(pick(self.rng, self.nodes))


def candidates(request: SharingRequest, cluster: SharingCluster) -> Candidates | None:
    """Where the request's task fits, or None when it fits nowhere."""
    import numpy as np

    ok, fits = feasible(request.task, cluster)
    if request.avoid_nodes:
        ok = ok.copy()
        ok[[n for n in request.avoid_nodes if 0 <= n < len(ok)]] = False
    nodes = np.flatnonzero(ok)
    if not len(nodes):
        return None
    return Candidates(request.task, cluster, nodes, fits, np.random.default_rng(request.seed))


def node_score(name: str, *, maximise: bool = True, default: bool = False) -> Callable[[Callable[[Candidates], Any]],
                                                                                       Policy]:
    """Register a policy that scores each candidate node (an array, one score per candidate)."""
    def wrap(score: Callable[[Candidates], Any]) -> Policy:
        def policy(request: SharingRequest, cluster: SharingCluster) -> SharingPlacement | None:
            found = candidates(request, cluster)
            return None if found is None else found.best(score(found), maximise)

        policy.__name__ = policy.__qualname__ = score.__name__
        policy.__doc__ = score.__doc__
        return SHARING_POLICIES.register(name, default=default)(policy)
    return wrap
