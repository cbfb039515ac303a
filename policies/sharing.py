"""GPU-sharing placement: which node and which GPU(s) a task gets when GPUs can be shared.

A node has CPU, memory and GPUs; each GPU has a compute share left (in thousandths of a GPU,
``milli``: 1000 is a whole free GPU) and GPU memory left. A task asks for CPU, memory and either
no GPU, a fraction of one GPU or whole GPUs (``policies.sharing_model``). Every policy honours the
same hard rules: the GPU model is one the task accepts, CPU and memory are never oversubscribed, a
GPU never gives more share or memory than it has left, and a fraction always sits on one GPU.

Policies (kind ``sharing``; ``fgd`` is the default), each part in its own module:

- ``policies.sharing_fgd``: ``fgd``, fragmentation gradient descent (the paper's FGD);
- ``policies.sharing_baselines``: the FGD paper's baselines as its simulator scores them
  (``best_fit``, ``dot_product``, ``gpu_packing``, ``gpu_clustering``, ``random``) and ``first_fit``;
- ``policies.sharing_fit``: what they share (where a task fits, ties, which GPUs of a node);
- ``policies.sharing_model``: nodes, task shapes, requests, placements and the cluster's state.

Policies are pure: the same request and cluster give the same answer (ties are broken at random
with the request's seed, as the Kubernetes scheduler breaks them, except in ``first_fit``).

This module is the one to import: it loads (and so registers) every policy.
"""

from policies.sharing_baselines import best_fit, dot_product, first_fit, gpu_clustering, gpu_packing, random_fit
from policies.sharing_fgd import expected_fragmentation, fgd
from policies.sharing_fit import Policy, feasible
from policies.sharing_model import (
    MILLI,
    PlacementRefused,
    SharingCluster,
    SharingNode,
    SharingPlacement,
    SharingRequest,
    TaskShape,
    WorkloadMix,
)

__all__ = ["MILLI", "PlacementRefused", "Policy", "SharingCluster", "SharingNode", "SharingPlacement",
           "SharingRequest", "TaskShape", "WorkloadMix", "best_fit", "dot_product", "expected_fragmentation",
           "feasible", "fgd", "first_fit", "gpu_clustering", "gpu_packing", "random_fit"]
