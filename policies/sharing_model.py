"""What GPU-sharing placement works on: nodes, task shapes, requests, placements and the cluster's state.

The cluster is an immutable ``SharingCluster`` of numpy arrays (read-only) with per-node,
per-shape aggregates that ``with_placement`` updates for the one node that changed, so a decision
on a cluster of a thousand nodes scores every node with a few vectorised operations instead of
rescanning GPUs.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from policies.errors import PolicyError
from policies.registry import Registry

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt

    IntArray = npt.NDArray[np.int64]
    FloatArray = npt.NDArray[np.float64]
    BoolArray = npt.NDArray[np.bool_]

MILLI = 1000  # a whole GPU's share
NO_GPU_MEMORY_LIMIT = 1 << 40  # MiB; a node whose GPU memory is unknown limits tasks by share only
MAX_SHAPES = 48  # the most frequent task shapes the fragmentation measure weighs


class PlacementRefused(PolicyError, ValueError):
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

    @property
    def affinity(self) -> tuple[int, int]:
        """The task's kind of GPU request, as ``gpu_clustering`` groups them: any fraction (1, 0), or N whole GPUs."""
        return (1, 0) if self.is_fraction else (self.gpus, self.gpu_milli)


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
    """``avoid_nodes``: node indices the task may not take (the nodes a gang's other shares hold)."""

    task: TaskShape
    mix: WorkloadMix = WorkloadMix()
    seed: int = 0
    task_id: str = ""
    avoid_nodes: frozenset[int] = frozenset()


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
    tags: tuple[frozenset[tuple[int, int]], ...]  # GPU request kinds (affinity) on each node (gpu_clustering)
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
            tags = (*tags[:n], tags[n] | {task.affinity}, *tags[n + 1:])
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
            tags = (*tags[:node], tags[node] | {task.affinity}, *tags[node + 1:])
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


class SharingPolicy(Protocol):
    """Which node and GPU fractions a task that shares GPUs takes; None if it does not fit."""

    def __call__(self, request: SharingRequest, cluster: SharingCluster, /) -> SharingPlacement | None: ...


SHARING_POLICIES: Registry[SharingPolicy] = Registry("sharing")
