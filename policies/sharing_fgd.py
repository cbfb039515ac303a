"""Fragmentation gradient descent (``fgd``, the default sharing policy), after Weng et al., "Beware
of Fragmentation" (ATC'23).

The fragmentation of a node for a task shape is the GPU share left on it that the shape could not
use: all of it when the shape does not fit the node at all (CPU, memory, GPU model, not enough GPUs
with enough share), otherwise the share left on GPUs with less than the shape asks. The expected
fragmentation weighs the shapes seen so far (``WorkloadMix``; the replay weighs them by the GPU
share they brought); the task goes to the node and GPU whose expected fragmentation grows least.
A shape bound to some GPU models weighs, on every node, its share of the demand over the share of
the free GPU it can use (``_weights``): what the expected workload can use is counted by model.
Among placements that leave it alike, the tightest node (least CPU, memory and GPU share left)
wins, and on it the GPU left with the least share.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from policies.sharing_fit import best_index, candidates
from policies.sharing_model import (
    MILLI,
    SHARING_POLICIES,
    SharingCluster,
    SharingPlacement,
    SharingRequest,
    TaskShape,
    WorkloadMix,
)


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


# How steeply a bound shape's weight grows as the GPUs it can use get scarce: 1 is its demand over its
# share of the free GPU; 1.5 also protects a scarce model before it runs low, which the linear weight
# did too late on some seeds (benchmarks/README.md, "GPU sharing").
SCARCITY_POWER = 1.5


@lru_cache(maxsize=16)
def _accepts(arrays: _MixArrays, models: tuple[str, ...]) -> Any:
    """``models x shapes``: a shape can use a GPU of that model."""
    import numpy as np

    return np.array([[not s.gpu_types or m in s.gpu_types for s in arrays.shapes] for m in models], dtype=bool)


def _allowed(cluster: SharingCluster, arrays: _MixArrays, nodes: Any) -> Any:
    if not arrays.typed:
        return True
    return _accepts(arrays, cluster.models)[cluster.model_of[nodes]]


def _weights(cluster: SharingCluster, arrays: _MixArrays) -> Any:
    """Each shape's weight on the GPUs it can use: its share of the expected demand, times (the cluster's
    free GPU over the free GPU of the models it accepts) ** SCARCITY_POWER.

    Without GPU-type constraints every shape can use every GPU and this is the mix's weight. A shape
    bound to T4, a tenth of the demand while T4s are a seventh of the free GPUs, is most of what a
    T4 node is expected to host; weighed by its share of the whole cluster instead, the T4 nodes
    look as free for any task as the rest, and unconstrained tasks fill them first (the 2-GPU T4
    nodes are the tightest) until the T4-bound tasks find none.
    """
    import numpy as np

    if not arrays.typed:
        return arrays.weights
    free = np.clip(cluster.gpu_left, 0, None).sum(axis=1)
    per_model = np.bincount(cluster.model_of, weights=free, minlength=len(cluster.models))
    usable = per_model @ _accepts(arrays, cluster.models)
    return arrays.weights * (max(float(per_model.sum()), MILLI) / np.maximum(usable, MILLI)) ** SCARCITY_POWER


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
    return frag @ _weights(cluster, arrays)


@SHARING_POLICIES.register("fgd", default=True)
def fgd(request: SharingRequest, cluster: SharingCluster) -> SharingPlacement | None:
    """The node and GPU whose expected fragmentation (against the mix seen so far) grows least."""
    import numpy as np

    found = candidates(request, cluster)
    if found is None:
        return None
    task, where, fits = request.task, found.nodes, found.fits
    arrays = _mix_arrays(request.mix)
    if not arrays.shapes:
        arrays = _mix_arrays(WorkloadMix((task,), (1.0,)) if task.gpus else WorkloadMix())
    if not arrays.shapes:  # nothing seen needs a GPU: any node will do
        return found.any()
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
    growth = (frag_a - frag_b) @ _weights(cluster, arrays)
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
    chosen = int(near[best_index(leftover, found.rng, maximise=False)])
    return found.place(int(cand_nodes[chosen]), None if cand_gpu is None else int(cand_gpu[chosen]))
