"""The FGD paper's baseline placement policies, scored as the authors' simulator scores them.

Weng et al., "Beware of Fragmentation" (ATC'23), compare FGD with these heuristics in their
Kubernetes scheduler simulator. Each is a node score (the best node wins, ties at random as
``kube-scheduler`` breaks them); on the chosen node a fraction takes the fitting GPU with the least
share left. ``gpu_packing`` and ``gpu_clustering`` keep the simulator's integer scores on
``kube-scheduler``'s 0-100 scale: the rounding is what makes their many ties, and the ties are part
of how those heuristics behave. ``first_fit`` is not in the paper: the first node in list order.
"""

from __future__ import annotations

from typing import Any

from policies.sharing_fit import Candidates, best_index, candidates, node_score
from policies.sharing_model import MILLI, SHARING_POLICIES, SharingCluster, SharingPlacement, SharingRequest

MAX_NODE_SCORE = 100  # kube-scheduler's framework.MaxNodeScore
MAX_SPEC_GPU_NODE = 8  # the simulator's MaxSpecGpu (8000 milli): the largest node's GPUs


@SHARING_POLICIES.register("first_fit")
def first_fit(request: SharingRequest, cluster: SharingCluster) -> SharingPlacement | None:
    """The first node in list order that fits; its first GPUs that fit."""
    import numpy as np

    found = candidates(request, cluster)
    if found is None:
        return None
    node = int(found.nodes[0])
    if request.task.is_fraction:
        return found.place(node, int(np.argmax(found.fits[node])))
    return found.place(node)


@SHARING_POLICIES.register("random")
def random_fit(request: SharingRequest, cluster: SharingCluster) -> SharingPlacement | None:
    """A random node that fits, and random GPUs of it that fit (seeded by the request)."""
    import numpy as np

    found = candidates(request, cluster)
    if found is None:
        return None
    node = found.any().node
    if not request.task.gpus:
        return SharingPlacement(node, (), 0)
    chosen = found.rng.choice(np.flatnonzero(found.fits[node]), size=request.task.gpus, replace=False)
    return SharingPlacement(node, tuple(sorted(int(g) for g in chosen)), request.task.gpu_milli)


@node_score("best_fit", maximise=False)
def best_fit(c: Candidates) -> Any:
    """The node with the least CPU and GPU share left after placing (half weight each)."""
    import numpy as np

    cluster, task = c.cluster, c.task
    gpu_free = np.clip(cluster.gpu_left[c.nodes], 0, None).sum(axis=1)
    return (0.5 * (cluster.cpu_left[c.nodes] - task.cpu_milli) / cluster.cpu_max
            + 0.5 * (gpu_free - task.total_gpu_milli) / (MILLI * cluster.gpus_max))


@SHARING_POLICIES.register("dot_product")
def dot_product(request: SharingRequest, cluster: SharingCluster) -> SharingPlacement | None:
    """Tetris-style alignment as FGD's simulator scores it: the smallest dot product of the node's
    free (CPU, GPU) and the task's demand, both normalised; for a fraction, per GPU."""
    import numpy as np

    found = candidates(request, cluster)
    if found is None:
        return None
    task, where = request.task, found.nodes
    cpu_term = (cluster.cpu_left[where] / cluster.cpu_max) * (task.cpu_milli / cluster.cpu_max)
    if task.is_fraction:
        left = np.where(found.fits[where], cluster.gpu_left[where], np.iinfo(np.int64).max).astype(np.float64)
        score = cpu_term[:, None] + (left / MILLI) * (task.gpu_milli / MILLI)
        row, gpu = divmod(best_index(score.ravel(), found.rng, maximise=False), score.shape[1])
        return found.place(int(where[row]), int(gpu))
    free = (cluster.gpu_left[where] >= MILLI).sum(axis=1)
    return found.best(cpu_term + (free / cluster.gpus_max) * (task.gpus / cluster.gpus_max), maximise=False)


@node_score("gpu_packing")
def gpu_packing(c: Candidates) -> Any:
    """Shared GPUs first, then free GPUs of partly used nodes, then empty nodes (the simulator's
    ``getPackingScore``, integer arithmetic as there):

    - a node whose GPUs are all free: ``max(100 // 3 - free GPUs, free GPUs)``;
    - else, taking the fitting GPUs with the least share left first: if that takes whole free GPUs,
      ``max(100 // 2 - those taken, 100 // 3)``; if not, ``max(100 - (sum of each taken GPU's
      percent left) // 10, 100 // 2)``.
    """
    import numpy as np

    cluster, task, where = c.cluster, c.task, c.nodes
    if not task.gpus:
        return np.zeros(len(where), dtype=np.int64)  # kube-scheduler's MinNodeScore for every node
    left = cluster.gpu_left[where]
    gpus = np.array([cluster.nodes[i].gpus for i in where], dtype=np.int64)
    whole_free = (left >= MILLI).sum(axis=1)
    empty = np.maximum(MAX_NODE_SCORE // 3 - whole_free, whole_free)
    if task.is_fraction:
        tight = np.where(c.fits[where], left, np.iinfo(np.int64).max).min(axis=1)
        takes_whole = tight >= MILLI
        partly = np.where(takes_whole, np.maximum(MAX_NODE_SCORE // 2 - 1, MAX_NODE_SCORE // 3),
                          np.maximum(MAX_NODE_SCORE - (tight * 100 // MILLI) // 10, MAX_NODE_SCORE // 2))
    else:  # whole GPUs only fit free GPUs
        partly = np.full(len(where), max(MAX_NODE_SCORE // 2 - task.gpus, MAX_NODE_SCORE // 3), dtype=np.int64)
    return np.where(whole_free == gpus, empty, partly)


@node_score("gpu_clustering")
def gpu_clustering(c: Candidates) -> Any:
    """Nodes running only tasks of the same GPU request first, then nodes running some, then idle
    nodes, then the rest; within a band the node with the least GPU share left (the simulator's
    ``GpuClusteringScore``: the request is its kind, any fraction alike or N whole GPUs; integer
    ``25 * (8000 - share left) // 8000`` plus 25 per band)."""
    import numpy as np

    cluster, task, where = c.cluster, c.task, c.nodes
    if not task.gpus:
        return np.zeros(len(where), dtype=np.int64)
    kind = task.affinity
    band = np.array([(3 if len(t) == 1 else 2) if kind in t else (1 if not t else 0)
                     for t in (cluster.tags[i] for i in where)], dtype=np.int64)
    spec = MILLI * max(MAX_SPEC_GPU_NODE, cluster.gpus_max)
    left = np.clip(cluster.gpu_left[where], 0, None).sum(axis=1)
    quarter = MAX_NODE_SCORE // 4
    return quarter * (spec - left) // spec + band * quarter
