"""How much slower a job runs on a given placement than on its ideal one.

A trace's ``duration`` is the job's runtime on its ideal placement; the simulator stretches it by
``slowdown(job, placement) >= 1``. Two models:

``ProfileSpeed`` (measured): the placement profiles of the Sia/Pollux artifacts,
``<model>_placements-<set>.csv`` with ``local_bsz,step_time,sync_time,placement``. ``placement`` is
the GPUs used on each node, ascending (``26`` = 2 + 6 on two nodes); ``step_time`` is the whole
iteration, gradient sync included. A placement's relative step time is the geometric mean, over the
local batch sizes it was measured at, of its step time over the 1-GPU step time at the same batch
size (the per-GPU work is equal, so the ratio isolates the cost of where the GPUs are). The ideal
for k GPUs is the fastest measured placement of k GPUs. The profiles stop at two nodes: a gang of
up to 16 GPUs on more nodes is timed as the slowest measured two-node placement of as many GPUs
(spreading further never makes a ring faster, and timing it by a smaller gang's placement would
reward scattering), a bigger one as the two-node placement of its two largest parts.
``split_costs`` hands the same relative step times to a placement policy, keyed by split.

``BandwidthSpeed`` (modelled, no measurements needed): the ring all-reduce runs at its slowest hop,
so with ``share`` the fraction of an iteration spent in gradient sync on the ideal placement,
``slowdown = (1 - share) + share * ideal_ring_bw / ring_bw``, where ``ring_bw`` is the best ring's
slowest link inside each node and, across nodes, the node network (providers.topology).
"""

from __future__ import annotations

import csv
import math
from collections import defaultdict
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Protocol

from broker.sim.workload import WorkloadError
from policies.gang import GangPlacement
from policies.placement import ClusterSnapshot, MeasuredSplitCost, PlacementRequest, topology_aware
from providers.topology import NodeTopology, ring_bandwidth_gb_s

PROFILE_MODELS = ("bert", "cifar10", "deepspeech2", "imagenet", "yolov3")

# The Philly workloads' models mapped to the nearest profiled model: ImageNet CNNs to imagenet
# (ResNet-50), transformer language models to bert, small conv/point-cloud models to cifar10
# (ResNet-18 on 32x32 images).
MODEL_PROFILE: dict[str, str] = {
    "vgg19": "imagenet",
    "resnet50": "imagenet",
    "bert": "bert",
    "gpt2": "bert",
    "dcgan": "cifar10",
    "pointnet": "cifar10",
    **{m: m for m in PROFILE_MODELS},
}

# Share of an iteration spent in gradient sync with 8 GPUs on one NVLink node: the median of
# sync_time / step_time over local batch sizes in the Sia/Pollux DGX placement profiles
# (``<model>_placements-dgx.csv``, placement 8).
SYNC_SHARE: dict[str, float] = {
    "bert": 0.147,
    "cifar10": 0.064,
    "deepspeech2": 0.023,
    "imagenet": 0.085,
    "yolov3": 0.093,
}


class SpeedModel(Protocol):
    name: str

    def slowdown(self, model: str, gpus: int, placement: GangPlacement, cluster: ClusterSnapshot) -> float: ...

    def split_costs(self, model: str) -> MeasuredSplitCost | None:
        """The measured step time per split of a ``model`` job's GPUs over nodes, when measured."""
        ...


def profile_model(model: str) -> str:
    try:
        return MODEL_PROFILE[model.lower()]
    except KeyError:
        raise WorkloadError(
            f"model {model!r} has no speed profile; known models: {', '.join(sorted(MODEL_PROFILE))}"
        ) from None


def node_counts(placement: GangPlacement) -> tuple[int, ...]:
    return tuple(sorted((len(g) for _, g in placement.gpus), reverse=True))


def placement_ring_gb_s(topo: NodeTopology, placement: GangPlacement) -> float:
    intra = min((ring_bandwidth_gb_s(topo, gpus) for _, gpus in placement.gpus), default=math.inf)
    return intra if len(placement.gpus) == 1 else min(intra, topo.network_gb_s)


@dataclass
class BandwidthSpeed:
    name: str = "bandwidth model"
    _ideal: dict[tuple[str, int], float] = field(default_factory=dict)

    def _ideal_ring(self, topo: NodeTopology, gpus: int) -> float:
        key = (topo.instance_type, gpus)
        if key not in self._ideal:
            nodes = -(-gpus // topo.gpus)
            empty = ClusterSnapshot.empty("ideal", topo, nodes)
            best = topology_aware(PlacementRequest("ideal", gpus), empty)
            assert best is not None
            self._ideal[key] = placement_ring_gb_s(topo, best)
        return self._ideal[key]

    def slowdown(self, model: str, gpus: int, placement: GangPlacement, cluster: ClusterSnapshot) -> float:
        if gpus < 2:
            return 1.0
        share = SYNC_SHARE[profile_model(model)]
        ring = placement_ring_gb_s(cluster.topology, placement)
        ideal = self._ideal_ring(cluster.topology, gpus)
        return max(1.0, (1.0 - share) + share * ideal / ring)

    def split_costs(self, model: str) -> MeasuredSplitCost | None:
        return None  # nothing measured: ``topology`` already ranks placements by this model's bandwidths


@dataclass
class ProfileSpeed:
    relative: dict[str, dict[str, float]]  # profile model -> placement key -> relative step time
    profile_set: str
    name: str = "measured profiles"
    _costs: dict[str, MeasuredSplitCost] = field(default_factory=dict)

    @classmethod
    def load(cls, directory: Path, profile_set: str = "dgx") -> ProfileSpeed:
        if not directory.is_dir():
            raise WorkloadError(f"--profiles {directory}: not a directory")
        relative: dict[str, dict[str, float]] = {}
        for model in PROFILE_MODELS:
            path = directory / f"{model}_placements-{profile_set}.csv"
            if path.exists():
                relative[model] = _relative_step_times(path)
        if not relative:
            raise WorkloadError(
                f"--profiles {directory}: no <model>_placements-{profile_set}.csv files "
                f"(models: {', '.join(PROFILE_MODELS)})"
            )
        return cls(relative, profile_set)

    def _table(self, model: str) -> dict[str, float]:
        name = profile_model(model)
        if name not in self.relative:
            raise WorkloadError(f"model {model!r} maps to profile {name!r}, absent for set {self.profile_set!r}")
        return self.relative[name]

    def slowdown(self, model: str, gpus: int, placement: GangPlacement, cluster: ClusterSnapshot) -> float:
        if gpus < 2:
            return 1.0
        table = self._table(model)
        items = tuple(sorted(table.items()))
        counts = node_counts(placement)
        spread = _slowest_two_node(items, gpus) if len(counts) > 2 else None
        step = spread if spread is not None else _lookup(table, counts)
        return max(1.0, step / _ideal(items, gpus))

    def split_costs(self, model: str) -> MeasuredSplitCost:
        name = profile_model(model)
        if name not in self._costs:
            table = self._table(model)
            self._costs[name] = MeasuredSplitCost.of({tuple(int(c) for c in key): t for key, t in table.items()})
        return self._costs[name]


def _key(counts: tuple[int, ...]) -> str:
    if counts and counts[0] > 8:
        raise WorkloadError("the placement profiles cover nodes of up to 8 GPUs; use the bandwidth model")
    return "".join(str(c) for c in sorted(counts[:2]))


def _lookup(table: dict[str, float], counts: tuple[int, ...]) -> float:
    key = _key(counts)
    if key not in table:
        raise WorkloadError(f"the placement profiles have no placement {key!r} (nodes of up to 8 GPUs, 2 nodes)")
    return table[key]


@lru_cache(maxsize=4096)
def _slowest_two_node(items: tuple[tuple[str, float], ...], gpus: int) -> float | None:
    two_node = [v for k, v in items if len(k) == 2 and sum(int(c) for c in k) == gpus]
    return max(two_node, default=None)


@lru_cache(maxsize=4096)
def _ideal(items: tuple[tuple[str, float], ...], gpus: int) -> float:
    table = dict(items)
    same = [v for k, v in items if sum(int(c) for c in k) == gpus]
    if same:
        return min(same)
    full, rest = divmod(gpus, 8)
    return _lookup(table, tuple([8] * full + ([rest] if rest else [])))


def _relative_step_times(path: Path) -> dict[str, float]:
    steps: dict[str, dict[int, float]] = defaultdict(dict)
    with path.open(newline="") as handle:
        reader = csv.DictReader(handle)
        need = ("local_bsz", "step_time", "placement")
        if any(c not in (reader.fieldnames or ()) for c in need):
            raise WorkloadError(f"{path}: expected columns local_bsz,step_time,sync_time,placement")
        for row, rec in enumerate(reader, start=2):
            try:
                steps[rec["placement"].strip()][int(rec["local_bsz"])] = float(rec["step_time"])
            except ValueError:
                raise WorkloadError(f"{path}: row {row}: local_bsz/step_time must be numbers") from None
    single = steps.get("1")
    if not single:
        raise WorkloadError(f"{path}: no rows for placement 1 (the single-GPU baseline)")
    relative: dict[str, float] = {}
    for key, by_bsz in steps.items():
        ratios = [t / single[b] for b, t in by_bsz.items() if b in single and single[b] > 0 and t > 0]
        if ratios:
            relative[key] = math.exp(sum(math.log(r) for r in ratios) / len(ratios))
    return relative
