"""GPU-sharing placement: which node and which GPU(s) a task gets when GPUs can be shared.

A node has CPU, memory and GPUs; each GPU has a compute share left (in thousandths of a GPU,
``milli``: 1000 is a whole free GPU) and GPU memory left. A task asks for CPU, memory and either
no GPU, a fraction of one GPU (``gpus=1, gpu_milli < 1000``) or whole GPUs (``gpu_milli == 1000``),
optionally GPU memory per GPU and a set of acceptable GPU models. Every policy here honours the
same hard rules: the GPU model is one the task accepts, CPU and memory are never oversubscribed, a
GPU never gives more share or memory than it has left, and a fraction always sits on one GPU.

Policies (kind ``sharing``; ``fgd`` is the default):

- ``fgd``: fragmentation gradient descent, after Weng et al., "Beware of Fragmentation" (ATC'23).
  The fragmentation of a node for a task shape is the GPU share left on it that the shape could
  not use: all of it when the shape does not fit the node at all (CPU, memory, GPU model, not
  enough GPUs with enough share), otherwise the share left on GPUs with less than the shape asks.
  The expected fragmentation weighs the shapes seen so far (``WorkloadMix``; the replay weighs
  them by the GPU share they brought); the task goes to the node and GPU whose expected
  fragmentation grows least.
  Among placements that leave it alike, the tightest node (least CPU, memory and GPU share left)
  wins. Whole-GPU gangs get the free GPUs with the tightest links where the node's topology is
  known.
- the FGD paper's baselines, as its simulator scores them: ``best_fit`` (least CPU and GPU left
  after placing, equal weights), ``dot_product`` (Tetris-style alignment: smallest dot product of
  the node's free resources and the task's demand, per GPU for fractions), ``gpu_packing``
  (shared GPUs first, then partly used nodes, then empty nodes), ``gpu_clustering`` (nodes already
  running tasks of the same GPU request first), ``random`` (a random node that fits) and
  ``first_fit`` (the first node in the list that fits, its first GPUs that fit).

Ties are broken at random with the request's seed (as the Kubernetes scheduler does) except in
``first_fit``. Policies are pure: the same request and cluster give the same answer.

The cluster is an immutable ``SharingCluster`` of numpy arrays (read-only) with per-node,
per-shape aggregates that ``with_placement`` updates for the one node that changed, so a decision
on a cluster of a thousand nodes scores every node with a few vectorised operations instead of
rescanning GPUs.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from typing import TYPE_CHECKING, Any

from policies.registry import register

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt

    IntArray = npt.NDArray[np.int64]
    FloatArray = npt.NDArray[np.float64]
    BoolArray = npt.NDArray[np.bool_]

MILLI = 1000  # a whole GPU's share
NO_GPU_MEMORY_LIMIT = 1 << 40  # MiB; a node whose GPU memory is unknown limits tasks by share only
MAX_SHAPES = 48  # the most frequent task shapes the fragmentation measure weighs


class PlacementRefused(ValueError):
    """A placement that would break a hard rule (oversubscription, wrong GPU model, spread fraction)."""


@dataclass(frozen=True, slots=True)
class SharingNode:
    """A node as provisioned: its capacity (``gpu_memory_mib`` per GPU; 0 when unknown)."""

    name: str
    cpu_milli: int
    memory_mib: int
    gpus: int
    gpu_model: str
    gpu_memory_mib: int = 0
    instance_type: str | None = None  # for the GPU link topology, when known


@dataclass(frozen=True, slots=True)
class TaskShape:
    """What a task asks for: CPU (thousandths of a core), memory, GPUs and the share of each.

    ``gpus=0``: CPU only. ``gpus=1, gpu_milli<1000``: a fraction of one GPU. ``gpu_milli=1000``:
    whole GPUs. ``gpu_memory_mib`` is per GPU (0: any); ``gpu_types`` the accepted GPU models
    (empty: any).
    """

    cpu_milli: int = 0
    memory_mib: int = 0
    gpus: int = 0
    gpu_milli: int = 0
    gpu_memory_mib: int = 0
    gpu_types: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.cpu_milli < 0 or self.memory_mib < 0 or self.gpu_memory_mib < 0:
            raise ValueError("a task cannot ask for negative CPU or memory")
        if self.gpus < 0:
            raise ValueError("a task cannot ask for a negative number of GPUs")
        if self.gpus == 0 and self.gpu_milli != 0:
            raise ValueError("a task without GPUs has no GPU share")
        if self.gpus > 0 and not 0 < self.gpu_milli <= MILLI:
            raise ValueError(f"a GPU share is between 1 and {MILLI} thousandths, got {self.gpu_milli}")
        if self.gpus > 1 and self.gpu_milli != MILLI:
            raise ValueError("a fraction of a GPU is for one GPU only; several GPUs must be whole")

    @classmethod
    def of(cls, cpus: float = 0, memory_gb: float = 0, gpus: float = 0, gpu_memory_gb: float = 0,
           gpu_types: Iterable[str] = ()) -> TaskShape:
        """From cores, GB and a GPU count that may be a fraction (``gpus=0.5``)."""
        if gpus > 0 and gpus < 1:
            count, milli = 1, round(gpus * MILLI)
        elif gpus >= 1:
            if gpus != int(gpus):
                raise ValueError(f"a GPU count above 1 must be whole, got {gpus}")
            count, milli = int(gpus), MILLI
        else:
            count, milli = 0, 0
        return cls(round(cpus * 1000), round(memory_gb * 1024), count, milli, round(gpu_memory_gb * 1024),
                   tuple(gpu_types))

    @property
    def total_gpu_milli(self) -> int:
        return self.gpus * self.gpu_milli

    @property
    def is_fraction(self) -> bool:
        return self.gpus == 1 and self.gpu_milli < MILLI


@dataclass(frozen=True, slots=True)
class WorkloadMix:
    """Task shapes seen so far and how often: what the fragmentation measure expects to come."""

    shapes: tuple[TaskShape, ...] = ()
    weights: tuple[float, ...] = ()

    @classmethod
    def of(cls, counts: dict[TaskShape, float], limit: int = MAX_SHAPES) -> WorkloadMix:
        """The ``limit`` most frequent shapes, weights normalised to 1 (ties by first seen)."""
        top = sorted(counts.items(), key=lambda kv: -kv[1])[:limit]
        total = sum(w for _, w in top)
        if total <= 0:
            return cls()
        return cls(tuple(s for s, _ in top), tuple(w / total for _, w in top))


    @classmethod
    def by_gpu_demand(cls, counts: dict[TaskShape, float], limit: int = MAX_SHAPES) -> WorkloadMix:
        """Shapes weighted by the GPU share they brought (count x share), not by count alone.

        Fragmentation is GPU share lost, so a shape matters by how much GPU it asks for: a
        whole-GPU task that cannot start loses a GPU, a 0.1 task a tenth. On the Alibaba trace this
        leaves about 0.7 points less GPU unallocated than counting tasks (benchmarks/sharing.py).
        """
        return cls.of({s: n * max(1, s.total_gpu_milli) for s, n in counts.items()}, limit)


@dataclass(frozen=True, slots=True)
class SharingRequest:
    task: TaskShape
    mix: WorkloadMix = WorkloadMix()
    seed: int = 0
    task_id: str = ""


@dataclass(frozen=True, slots=True)
class SharingPlacement:
    """Node index, the GPUs of that node the task gets, and the share of each it holds."""

    node: int
    gpus: tuple[int, ...]
    gpu_milli: int

    def visible_devices(self) -> str:
        return ",".join(str(g) for g in self.gpus)


def _ro(array: Any) -> Any:
    array.flags.writeable = False
    return array


@dataclass(frozen=True, eq=False)
class SharingCluster:
    """The free resources of every node, as read-only arrays; ``with_placement`` gives the next one.

    ``gpu_left``/``gpu_mem_left`` are ``nodes x max GPUs``, -1 where a node has fewer GPUs.
    ``share_cols`` maps GPU shares (milli) to columns of ``fit_count`` (GPUs of the node with at
    least that share left) and ``short_milli`` (share left on the GPUs with less): all the
    fragmentation measure needs of the GPUs, whatever the CPU, memory and count of the shape.
    """

    nodes: tuple[SharingNode, ...]
    models: tuple[str, ...]
    model_of: Any  # int array: index into models
    cpu_left: Any
    mem_left: Any
    gpu_left: Any
    gpu_mem_left: Any
    cpu_max: float
    mem_max: float
    gpus_max: int
    tags: tuple[frozenset[tuple[int, int]], ...]  # GPU request kinds running on each node (gpu_clustering)
    share_cols: dict[int, int] = field(default_factory=dict)
    fit_count: Any = None
    short_milli: Any = None

    @classmethod
    def of(cls, nodes: Sequence[SharingNode]) -> SharingCluster:
        import numpy as np

        if not nodes:
            raise ValueError("a cluster needs at least one node")
        width = max(1, max(n.gpus for n in nodes))
        models = tuple(sorted({n.gpu_model for n in nodes}))
        gpu_left = np.full((len(nodes), width), -1, dtype=np.int64)
        gpu_mem = np.full((len(nodes), width), -1, dtype=np.int64)
        for i, n in enumerate(nodes):
            if n.cpu_milli < 0 or n.memory_mib < 0 or n.gpus < 0 or n.gpu_memory_mib < 0:
                raise ValueError(f"node {n.name}: negative capacity")
            gpu_left[i, : n.gpus] = MILLI
            gpu_mem[i, : n.gpus] = n.gpu_memory_mib or NO_GPU_MEMORY_LIMIT
        return cls(
            nodes=tuple(nodes), models=models,
            model_of=_ro(np.array([models.index(n.gpu_model) for n in nodes], dtype=np.int64)),
            cpu_left=_ro(np.array([n.cpu_milli for n in nodes], dtype=np.int64)),
            mem_left=_ro(np.array([n.memory_mib for n in nodes], dtype=np.int64)),
            gpu_left=_ro(gpu_left), gpu_mem_left=_ro(gpu_mem),
            cpu_max=float(max(1, max(n.cpu_milli for n in nodes))),
            mem_max=float(max(1, max(n.memory_mib for n in nodes))), gpus_max=width,
            tags=tuple(frozenset() for _ in nodes),
            fit_count=_ro(np.zeros((len(nodes), 0), dtype=np.int64)),
            short_milli=_ro(np.zeros((len(nodes), 0), dtype=np.int64)),
        )

    # -- what is free -------------------------------------------------------------------------------

    @property
    def gpu_capacity_milli(self) -> int:
        return MILLI * sum(n.gpus for n in self.nodes)

    @property
    def gpu_free_milli(self) -> int:
        import numpy as np

        return int(np.clip(self.gpu_left, 0, None).sum())

    def free_gpu_milli(self, node: int) -> int:
        return int(sum(max(0, int(v)) for v in self.gpu_left[node]))

    # -- the fragmentation aggregates ---------------------------------------------------------------

    def with_shapes(self, shapes: Iterable[TaskShape]) -> SharingCluster:
        """The same cluster with aggregates for the GPU shares of ``shapes`` too (then kept up to date)."""
        import numpy as np

        new = [m for m in dict.fromkeys(s.gpu_milli for s in shapes if s.gpus) if m not in self.share_cols]
        if not new:
            return self
        cols = dict(self.share_cols)
        fit = [self.fit_count]
        short = [self.short_milli]
        for m in new:
            cols[m] = len(cols)
            c, sh = _row_aggregates_all(self.gpu_left, m)
            fit.append(c[:, None])
            short.append(sh[:, None])
        return SharingCluster(self.nodes, self.models, self.model_of, self.cpu_left, self.mem_left, self.gpu_left,
                              self.gpu_mem_left, self.cpu_max, self.mem_max, self.gpus_max, self.tags, cols,
                              _ro(np.hstack(fit)), _ro(np.hstack(short)))

    def _cols(self, shapes: Sequence[TaskShape]) -> Any:
        import numpy as np

        return np.array([self.share_cols[s.gpu_milli] for s in shapes], dtype=np.int64)

    # -- placing --------------------------------------------------------------------------------------

    def check(self, task: TaskShape, placement: SharingPlacement) -> None:
        """Raise PlacementRefused when ``placement`` breaks a hard rule for ``task``."""
        n = placement.node
        if not 0 <= n < len(self.nodes):
            raise PlacementRefused(f"no node {n}")
        node = self.nodes[n]
        if task.gpus and task.gpu_types and node.gpu_model not in task.gpu_types:
            raise PlacementRefused(f"node {node.name} has {node.gpu_model}, the task accepts "
                                   f"{', '.join(task.gpu_types)}")
        if int(self.cpu_left[n]) < task.cpu_milli or int(self.mem_left[n]) < task.memory_mib:
            raise PlacementRefused(f"node {node.name} has not enough CPU or memory left")
        if len(placement.gpus) != task.gpus or len(set(placement.gpus)) != task.gpus:
            raise PlacementRefused(f"the task needs {task.gpus} distinct GPU(s), got {placement.gpus}")
        if placement.gpu_milli != task.gpu_milli:
            raise PlacementRefused("the placement's share differs from the task's")
        for g in placement.gpus:
            if not 0 <= g < node.gpus:
                raise PlacementRefused(f"node {node.name} has no GPU {g}")
            if int(self.gpu_left[n, g]) < task.gpu_milli or int(self.gpu_mem_left[n, g]) < task.gpu_memory_mib:
                raise PlacementRefused(f"GPU {g} of node {node.name} has not enough share or memory left")

    def with_placement(self, task: TaskShape, placement: SharingPlacement) -> SharingCluster:
        """The cluster after ``task`` takes ``placement``; PlacementRefused if it does not fit."""

        self.check(task, placement)
        n = placement.node
        cpu = self.cpu_left.copy()
        mem = self.mem_left.copy()
        cpu[n] -= task.cpu_milli
        mem[n] -= task.memory_mib
        gpu_left, gpu_mem, tags = self.gpu_left, self.gpu_mem_left, self.tags
        fit, short = self.fit_count, self.short_milli
        if task.gpus:
            gpu_left = gpu_left.copy()
            gpu_mem = gpu_mem.copy()
            for g in placement.gpus:
                gpu_left[n, g] -= task.gpu_milli
                gpu_mem[n, g] -= task.gpu_memory_mib
            tags = (*tags[:n], tags[n] | {(task.gpus, task.gpu_milli)}, *tags[n + 1:])
            if self.share_cols:
                fit = fit.copy()
                short = short.copy()
                fit[n], short[n] = _row_aggregates(gpu_left[n], self._share_milli())
                fit, short = _ro(fit), _ro(short)
            gpu_left, gpu_mem = _ro(gpu_left), _ro(gpu_mem)
        return SharingCluster(self.nodes, self.models, self.model_of, _ro(cpu), _ro(mem), gpu_left, gpu_mem,
                              self.cpu_max, self.mem_max, self.gpus_max, tags, self.share_cols, fit, short)

    def with_held(self, node: int, task: TaskShape, gpus: tuple[int, ...]) -> SharingCluster:
        """The cluster with ``task`` found already holding ``gpus`` of ``node`` (before aggregates are built).

        What runs is not refused: a holder the node cannot fit (a claim on GPUs its previous gang
        has not left yet) leaves what it overdraws at zero, never below, so it frees nothing.
        """
        if self.share_cols:
            raise ValueError("with_held describes what a cluster holds before any placement is scored")
        cpu, mem, left, gmem = (a.copy() for a in (self.cpu_left, self.mem_left, self.gpu_left, self.gpu_mem_left))
        cpu[node] = max(0, int(cpu[node]) - task.cpu_milli)
        mem[node] = max(0, int(mem[node]) - task.memory_mib)
        for g in gpus:
            if 0 <= g < self.nodes[node].gpus:
                left[node, g] = max(0, int(left[node, g]) - task.gpu_milli)
                gmem[node, g] = max(0, int(gmem[node, g]) - task.gpu_memory_mib)
        tags = self.tags
        if task.gpus:
            tags = (*tags[:node], tags[node] | {(task.gpus, task.gpu_milli)}, *tags[node + 1:])
        return SharingCluster(self.nodes, self.models, self.model_of, _ro(cpu), _ro(mem), _ro(left), _ro(gmem),
                              self.cpu_max, self.mem_max, self.gpus_max, tags, self.share_cols,
                              self.fit_count, self.short_milli)

    def _share_milli(self) -> Any:
        """The GPU share of each aggregate column, in column order."""
        import numpy as np

        out = np.empty(len(self.share_cols), dtype=np.int64)
        for m, col in self.share_cols.items():
            out[col] = m
        return out

    def allowed_models(self, task: TaskShape) -> Any:
        """Boolean per node: the node's GPU model is one the task accepts."""
        import numpy as np

        if not task.gpus or not task.gpu_types:
            return np.ones(len(self.nodes), dtype=bool)
        ok = [i for i, m in enumerate(self.models) if m in task.gpu_types]
        return np.isin(self.model_of, np.array(ok, dtype=np.int64))


def _row_aggregates_all(gpu_left: Any, milli: int) -> tuple[Any, Any]:
    """Per node: GPUs with at least ``milli`` share left, and the share left on the others."""
    import numpy as np

    fits = gpu_left >= milli
    short = np.where(~fits & (gpu_left > 0), gpu_left, 0).sum(axis=1)
    return fits.sum(axis=1).astype(np.int64), short.astype(np.int64)


def _row_aggregates(row: Any, milli: Any) -> tuple[Any, Any]:
    """``_row_aggregates_all`` for one node and many shares at once."""
    import numpy as np

    fits = row[None, :] >= milli[:, None]
    short = np.where(~fits & (row > 0), row, 0).sum(axis=1)
    return fits.sum(axis=1), short


# -- what fits ---------------------------------------------------------------------------------------


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


def _pick(rng: Any, candidates: Any) -> int:
    return int(candidates[int(rng.integers(len(candidates)))]) if len(candidates) > 1 else int(candidates[0])


def _best(score: Any, rng: Any, maximise: bool = True) -> int:
    """Index of the best finite score, ties broken at random."""
    import numpy as np

    best = np.max(score) if maximise else np.min(score)
    return _pick(rng, np.flatnonzero(score == best))


def _rng(request: SharingRequest) -> Any:
    import numpy as np

    return np.random.default_rng(request.seed)


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


def _whole_gpus(task: TaskShape, cluster: SharingCluster, node: int, fits: Any) -> tuple[int, ...]:
    """GPUs for a task on ``node``: for a gang of whole GPUs the tightest-linked free ones."""
    free = tuple(int(g) for g in range(cluster.nodes[node].gpus) if fits[node, g])
    instance_type = cluster.nodes[node].instance_type
    if task.gpus > 1 and instance_type:
        return _tightest(instance_type, free, task.gpus)
    return free[: task.gpus]


def _tightest_gpu(cluster: SharingCluster, node: int, fits: Any) -> int:
    """The fitting GPU of ``node`` with the least share left (lowest index on ties)."""
    import numpy as np

    left = np.where(fits[node], cluster.gpu_left[node], np.iinfo(np.int64).max)
    return int(np.argmin(left))


def _place(task: TaskShape, cluster: SharingCluster, node: int, fits: Any,
           gpu: int | None = None) -> SharingPlacement:
    if not task.gpus:
        return SharingPlacement(node, (), 0)
    if task.is_fraction:
        return SharingPlacement(node, (gpu if gpu is not None else _tightest_gpu(cluster, node, fits),), task.gpu_milli)
    return SharingPlacement(node, _whole_gpus(task, cluster, node, fits), task.gpu_milli)


Policy = Callable[[SharingRequest, SharingCluster], SharingPlacement | None]


# -- baselines ---------------------------------------------------------------------------------------


@register("sharing", "first_fit")
def first_fit(request: SharingRequest, cluster: SharingCluster) -> SharingPlacement | None:
    """The first node in list order that fits; its first GPUs that fit."""
    import numpy as np

    task = request.task
    ok, fits = feasible(task, cluster)
    where = np.flatnonzero(ok)
    if not len(where):
        return None
    node = int(where[0])
    if task.is_fraction:
        return SharingPlacement(node, (int(np.argmax(fits[node])),), task.gpu_milli)
    return _place(task, cluster, node, fits)


@register("sharing", "random")
def random_fit(request: SharingRequest, cluster: SharingCluster) -> SharingPlacement | None:
    """A random node that fits, and random GPUs of it that fit (seeded by the request)."""
    import numpy as np

    task = request.task
    ok, fits = feasible(task, cluster)
    where = np.flatnonzero(ok)
    if not len(where):
        return None
    rng = _rng(request)
    node = _pick(rng, where)
    if not task.gpus:
        return SharingPlacement(node, (), 0)
    gpus = np.flatnonzero(fits[node])
    chosen = rng.choice(gpus, size=task.gpus, replace=False)
    return SharingPlacement(node, tuple(sorted(int(g) for g in chosen)), task.gpu_milli)


@register("sharing", "best_fit")
def best_fit(request: SharingRequest, cluster: SharingCluster) -> SharingPlacement | None:
    """The node with the least CPU and GPU share left after placing (half weight each)."""
    import numpy as np

    task = request.task
    ok, fits = feasible(task, cluster)
    where = np.flatnonzero(ok)
    if not len(where):
        return None
    gpu_free = np.clip(cluster.gpu_left[where], 0, None).sum(axis=1)
    left = (0.5 * (cluster.cpu_left[where] - task.cpu_milli) / cluster.cpu_max
            + 0.5 * (gpu_free - task.total_gpu_milli) / (MILLI * cluster.gpus_max))
    node = int(where[_best(left, _rng(request), maximise=False)])
    return _place(task, cluster, node, fits)


@register("sharing", "dot_product")
def dot_product(request: SharingRequest, cluster: SharingCluster) -> SharingPlacement | None:
    """Tetris-style alignment as FGD's simulator scores it: the smallest dot product of the node's
    free (CPU, GPU) and the task's demand, both normalised; for a fraction, per GPU."""
    import numpy as np

    task = request.task
    ok, fits = feasible(task, cluster)
    where = np.flatnonzero(ok)
    if not len(where):
        return None
    rng = _rng(request)
    cpu_term = (cluster.cpu_left[where] / cluster.cpu_max) * (task.cpu_milli / cluster.cpu_max)
    if task.is_fraction:
        left = np.where(fits[where], cluster.gpu_left[where], np.iinfo(np.int64).max).astype(np.float64)
        score = cpu_term[:, None] + (left / MILLI) * (task.gpu_milli / MILLI)
        flat = _best(score.ravel(), rng, maximise=False)
        row, gpu = divmod(flat, score.shape[1])
        return SharingPlacement(int(where[row]), (int(gpu),), task.gpu_milli)
    free = (cluster.gpu_left[where] >= MILLI).sum(axis=1)
    score = cpu_term + (free / cluster.gpus_max) * (task.gpus / cluster.gpus_max)
    node = int(where[_best(score, rng, maximise=False)])
    return _place(task, cluster, node, fits)


@register("sharing", "gpu_packing")
def gpu_packing(request: SharingRequest, cluster: SharingCluster) -> SharingPlacement | None:
    """Shared GPUs first (the fullest one), then free GPUs of partly used nodes (the fewest),
    then empty nodes (the smallest)."""
    import numpy as np

    task = request.task
    ok, fits = feasible(task, cluster)
    where = np.flatnonzero(ok)
    if not len(where):
        return None
    rng = _rng(request)
    if not task.gpus:
        return SharingPlacement(_pick(rng, where), (), 0)
    left = cluster.gpu_left[where]
    gpus = np.array([cluster.nodes[i].gpus for i in where])
    whole_free = (left >= MILLI).sum(axis=1)
    empty = whole_free == gpus
    if task.is_fraction:
        partial = fits[where] & (left < MILLI)
        tight = np.where(partial, left, MILLI).min(axis=1)
        shared = partial.any(axis=1)
        score = np.where(shared, np.maximum(100 - (tight * 100 // MILLI) / 10, 50),
                         np.where(empty, np.maximum(100 / 3 - whole_free, 0), 50 - 1))
    else:
        score = np.where(empty, np.maximum(100 / 3 - whole_free, 0), np.maximum(50 - task.gpus, 100 / 3))
    node = int(where[_best(score, rng)])
    return _place(task, cluster, node, fits)


@register("sharing", "gpu_clustering")
def gpu_clustering(request: SharingRequest, cluster: SharingCluster) -> SharingPlacement | None:
    """Nodes running only tasks of the same GPU request first, then nodes running some, then empty
    nodes, then the rest; the fullest node within each band."""
    import numpy as np

    task = request.task
    ok, fits = feasible(task, cluster)
    where = np.flatnonzero(ok)
    if not len(where):
        return None
    rng = _rng(request)
    if not task.gpus:
        return SharingPlacement(_pick(rng, where), (), 0)
    kind = (task.gpus, task.gpu_milli)
    band = np.array([(3 if len(t) == 1 else 2) if kind in t else (1 if not t else 0)
                     for t in (cluster.tags[i] for i in where)], dtype=np.float64)
    free = np.clip(cluster.gpu_left[where], 0, None).sum(axis=1)
    score = band + (1 - free / (MILLI * cluster.gpus_max)) * 0.999
    node = int(where[_best(score, rng)])
    return _place(task, cluster, node, fits)


# -- fragmentation gradient descent ------------------------------------------------------------------


@dataclass(frozen=True, eq=False)
class _MixArrays:
    """A mix's GPU shapes as arrays (CPU-only shapes leave every node's fragmentation alike)."""

    shapes: tuple[TaskShape, ...]
    weights: Any
    gpus: Any
    milli: Any
    cpu: Any
    mem: Any
    typed: bool


@lru_cache(maxsize=16)
def _mix_arrays(mix: WorkloadMix) -> _MixArrays:
    import numpy as np

    keep = [(s, w) for s, w in zip(mix.shapes, mix.weights, strict=True) if s.gpus]
    shapes = tuple(s for s, _ in keep)
    return _MixArrays(shapes, np.array([w for _, w in keep]), np.array([s.gpus for s in shapes], dtype=np.int64),
                      np.array([s.gpu_milli for s in shapes], dtype=np.int64),
                      np.array([s.cpu_milli for s in shapes], dtype=np.int64),
                      np.array([s.memory_mib for s in shapes], dtype=np.int64),
                      any(s.gpu_types for s in shapes))


def _allowed(cluster: SharingCluster, arrays: _MixArrays, nodes: Any) -> Any:
    import numpy as np

    if not arrays.typed:
        return True
    per_model = np.array([[not s.gpu_types or m in s.gpu_types for s in arrays.shapes] for m in cluster.models])
    return per_model[cluster.model_of[nodes]]


def _frag(arrays: _MixArrays, allowed: Any, cpu: Any, mem: Any, fit: Any, short: Any, total: Any) -> Any:
    """``candidates x shapes``: the GPU share each candidate state leaves that a shape cannot use."""
    import numpy as np

    usable = (cpu[:, None] >= arrays.cpu) & (mem[:, None] >= arrays.mem) & (fit >= arrays.gpus)
    if allowed is not True:
        usable &= allowed
    return np.where(usable, short, total[:, None])


def expected_fragmentation(cluster: SharingCluster, mix: WorkloadMix) -> Any:
    """Per node, the GPU share (milli) the mix's tasks could not use, weighted by their frequency.

    CPU-only shapes are left out: they cannot use any GPU share, so they count every node's whole
    free share and change no comparison between placements.
    """
    import numpy as np

    arrays = _mix_arrays(mix)
    if not arrays.shapes:
        return np.zeros(len(cluster.nodes))
    cluster = cluster.with_shapes(arrays.shapes)
    cols = cluster._cols(arrays.shapes)
    nodes = np.arange(len(cluster.nodes))
    total = np.clip(cluster.gpu_left, 0, None).sum(axis=1)
    frag = _frag(arrays, _allowed(cluster, arrays, nodes), cluster.cpu_left, cluster.mem_left,
                 cluster.fit_count[:, cols], cluster.short_milli[:, cols], total)
    return frag @ arrays.weights


@register("sharing", "fgd", default=True)
def fgd(request: SharingRequest, cluster: SharingCluster) -> SharingPlacement | None:
    """The node and GPU whose expected fragmentation (against the mix seen so far) grows least."""
    import numpy as np

    task = request.task
    ok, fits = feasible(task, cluster)
    where = np.flatnonzero(ok)
    if not len(where):
        return None
    rng = _rng(request)
    arrays = _mix_arrays(request.mix)
    if not arrays.shapes:
        arrays = _mix_arrays(WorkloadMix((task,), (1.0,)) if task.gpus else WorkloadMix())
    if not arrays.shapes:  # nothing seen needs a GPU: any node will do
        return SharingPlacement(_pick(rng, where), (), 0)
    cluster = cluster.with_shapes(arrays.shapes)
    cols = cluster._cols(arrays.shapes)
    d = arrays.milli
    if task.is_fraction:
        # One candidate per node and distinct share left among its fitting GPUs.
        left = np.where(fits[where], cluster.gpu_left[where], -1)
        order = np.argsort(left, axis=1, kind="stable")
        srt = np.take_along_axis(left, order, axis=1)
        first = np.ones_like(srt, dtype=bool)
        first[:, 1:] = srt[:, 1:] != srt[:, :-1]
        rows, pos = np.nonzero(first & (srt >= 0))
        cand_nodes = where[rows]
        cand_gpu = order[rows, pos]
        before = srt[rows, pos]
        changed = 1
    else:
        cand_nodes = where
        cand_gpu = None
        before = np.full(len(where), MILLI)
        changed = task.gpus
    after = before - task.gpu_milli
    grid = np.ix_(cand_nodes, cols)
    fit_b = cluster.fit_count[grid]
    short_b = cluster.short_milli[grid]
    total_b = np.clip(cluster.gpu_left[cand_nodes], 0, None).sum(axis=1)
    cpu_b = cluster.cpu_left[cand_nodes]
    mem_b = cluster.mem_left[cand_nodes]
    allowed = _allowed(cluster, arrays, cand_nodes)
    frag_b = _frag(arrays, allowed, cpu_b, mem_b, fit_b, short_b, total_b)
    if task.gpus:
        b = before[:, None]
        a = after[:, None]
        fit_a = fit_b + changed * ((a >= d).astype(np.int64) - (b >= d))
        short_a = short_b + changed * (np.where((a < d) & (a > 0), a, 0) - np.where((b < d) & (b > 0), b, 0))
    else:
        fit_a, short_a = fit_b, short_b
    frag_a = _frag(arrays, allowed, cpu_b - task.cpu_milli, mem_b - task.memory_mib, fit_a, short_a,
                   total_b - task.total_gpu_milli)
    growth = (frag_a - frag_b) @ arrays.weights
    # Many placements leave the expected fragmentation alike (a whole GPU taken from a node with
    # several free). Among those, pack: the node left with the least CPU, memory and GPU share, so
    # load is not scattered over the cluster the way a random tie-break would scatter it, and on
    # it the GPU left with the least share (a half joins a half even when no whole-GPU task is expected).
    near = np.flatnonzero(growth <= growth.min() + 1e-6)
    nodes_near = cand_nodes[near]
    leftover = ((cluster.cpu_left[nodes_near] - task.cpu_milli) / cluster.cpu_max
                + (cluster.mem_left[nodes_near] - task.memory_mib) / cluster.mem_max
                + (total_b[near] - task.total_gpu_milli) / (MILLI * cluster.gpus_max)
                + 1e-3 * after[near] / MILLI)  # then the GPU left with the least share: fractions pack
    pick = int(near[_best(leftover, rng, maximise=False)])
    node = int(cand_nodes[pick])
    if cand_gpu is not None:
        return SharingPlacement(node, (int(cand_gpu[pick]),), task.gpu_milli)
    return _place(task, cluster, node, fits)
