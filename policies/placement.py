"""Placement policies: which GPUs of one cluster a gang gets, all of them or none.

Every policy is ``policy(request: PlacementRequest, cluster: ClusterSnapshot) -> GangPlacement | None``,
pure: ``None`` means the gang does not fit now. The engine and ``broker simulate-placement`` build
the same snapshot and call the same function.

``topology`` (the default) minimises the gang's communication cost first, then fragmentation:

1. fewest nodes: a gang that one node can hold goes on one node; a bigger one takes whole free
   nodes largest-first and its remainder on the node that fits it most tightly (best fit);
2. inside a node, the GPU subset whose best ring has the strongest slowest link, then the highest
   sum of pairwise link bandwidths (NVIDIA go-gpuallocator scores GPU sets by their pairwise links);
3. among equally good choices, the tightest node (best fit), then the subset that leaves the best
   connected GPUs behind, so the holes left stay usable by the next gang.

Measured step times replace rules 1 and 2 when the request carries them (``measured``): on some
hardware a gang steps as fast or faster spread over two nodes (4 + 4) than packed on one, and no
bandwidth model predicts that. ``topology`` then takes the measured split (per-node GPU counts) with
the lowest step time among those the free GPUs allow, each part on the tightest node that holds it
and its best-connected GPUs there; splits within the measurement's ``tolerance`` of the fastest go
to the one that breaks the fewest whole nodes, leaves the fewest free GPUs on the nodes it touches,
then uses the fewest nodes. Splits nobody measured are never guessed at: when no measured split
fits, rules 1-3 decide.

A request states a topology level (``node``, ``placement_group``, ``any``) it ``required``s or only
prefers, as Kueue's topology-aware scheduling does. Required levels bind every policy. ``topology``
already prefers the tightest level it can get, so a preferred level changes nothing for it (with
measured step times, the measurement decides whether one node is best); the baselines ignore
preferences and measurements.

Speed: the snapshot indexes its nodes once (free-GPU count buckets and distinct free masks per
placement group), and the best subset of every size for every free mask of an 8-GPU node type is
precomputed once per type, so a decision costs O(distinct masks + nodes taken), not O(cluster).
"""

from __future__ import annotations

import random as _random
from bisect import insort
from dataclasses import dataclass, field
from functools import cached_property, lru_cache
from operator import is_
from typing import Protocol

from policies.gang import GangPlacement
from policies.registry import Registry
from providers.topology import NodeTopology, ring_table, topology

LEVEL_NODE = "node"
LEVEL_GROUP = "placement_group"
LEVEL_ANY = "any"
LEVELS: tuple[str, ...] = (LEVEL_NODE, LEVEL_GROUP, LEVEL_ANY)


@dataclass(frozen=True, slots=True)
class PlacementRequest:
    """A gang to place: ``gpus`` anywhere, or ``num_nodes`` nodes with ``gpus / num_nodes`` each."""

    job_id: str
    gpus: int
    num_nodes: int | None = None
    level: str = LEVEL_ANY
    required: bool = False
    seed: int = 0  # the ``random`` baseline's seed; with job_id it fixes its choice
    previous: GangPlacement | None = None  # where the gang ran before (``packed_sticky`` keeps it)
    measured: MeasuredSplitCost | None = None  # measured step times per split (``topology`` uses them)

    def __post_init__(self) -> None:
        if not isinstance(self.gpus, int) or self.gpus < 1:
            raise ValueError(f"gpus must be a positive integer, got {self.gpus!r}")
        if self.num_nodes is not None:
            if not isinstance(self.num_nodes, int) or self.num_nodes < 1:
                raise ValueError(f"num_nodes must be a positive integer or None, got {self.num_nodes!r}")
            if self.gpus % self.num_nodes:
                raise ValueError(f"gpus ({self.gpus}) must be a multiple of num_nodes ({self.num_nodes})")
        if self.level not in LEVELS:
            raise ValueError(f"level must be one of {', '.join(LEVELS)}, got {self.level!r}")

    @property
    def gpus_per_node(self) -> int | None:
        return None if self.num_nodes is None else self.gpus // self.num_nodes


@dataclass(frozen=True, slots=True)
class MeasuredSplitCost:
    """Measured step time of a job per split of its GPUs over nodes, relative to any common unit.

    ``steps`` pairs a split, the GPUs used on each node in descending order (``(4, 4)`` = 4 + 4 on
    two nodes), with its step time. ``tolerance`` is the relative difference below which two splits
    count as equally fast, so fragmentation decides between them: set it to the measurements' noise.
    It defaults to 0 (trust every difference).
    """

    steps: tuple[tuple[tuple[int, ...], float], ...]
    tolerance: float = 0.0

    def __post_init__(self) -> None:
        seen: set[tuple[int, ...]] = set()
        for split, step in self.steps:
            if not split or any(not isinstance(c, int) or c < 1 for c in split):
                raise ValueError(f"a split must name positive GPU counts per node, got {split!r}")
            if tuple(sorted(split, reverse=True)) != split:
                raise ValueError(f"a split must list its per-node counts in descending order, got {split!r}")
            if split in seen:
                raise ValueError(f"split {split!r} is measured twice")
            if not step > 0:
                raise ValueError(f"step time of split {split!r} must be positive, got {step!r}")
            seen.add(split)
        if not 0 <= self.tolerance < 1:
            raise ValueError(f"tolerance must be in [0, 1), got {self.tolerance!r}")

    @classmethod
    def of(cls, steps: dict[tuple[int, ...], float], tolerance: float = 0.0) -> MeasuredSplitCost:
        """From a mapping in any order; splits are sorted so equal inputs give equal (hashable) costs."""
        return cls(tuple(sorted((tuple(sorted(s, reverse=True)), t) for s, t in steps.items())), tolerance)

    def splits(self, gpus: int) -> tuple[tuple[tuple[int, ...], float], ...]:
        return _splits_of(self, gpus)


@lru_cache(maxsize=1024)
def _splits_of(cost: MeasuredSplitCost, gpus: int) -> tuple[tuple[tuple[int, ...], float], ...]:
    return tuple((split, step) for split, step in cost.steps if sum(split) == gpus)


@dataclass(slots=True)
class _Scope:
    """Nodes a placement may use (one placement group, or the whole cluster), indexed for speed."""

    name: str
    free: int = 0
    by_count: list[list[int]] = field(default_factory=list)  # free count -> node ranks, ascending
    by_mask: dict[int, list[int]] = field(default_factory=dict)  # free mask -> node ranks, ascending

    def copy(self) -> _Scope:
        return _Scope(self.name, self.free, [list(r) for r in self.by_count],
                      {m: list(r) for m, r in self.by_mask.items()})

    def move(self, rank: int, old_mask: int, new_mask: int) -> None:
        """Re-file node ``rank`` whose free mask changed (lists stay in ascending rank order)."""
        if old_mask == new_mask:
            return
        self.by_count[old_mask.bit_count()].remove(rank)
        insort(self.by_count[new_mask.bit_count()], rank)
        same = self.by_mask[old_mask]
        same.remove(rank)
        if not same:
            del self.by_mask[old_mask]
        insort(self.by_mask.setdefault(new_mask, []), rank)
        self.free += new_mask.bit_count() - old_mask.bit_count()


@dataclass(frozen=True)
class ClusterSnapshot:
    """One cluster at one instant: for every node rank, which job holds each GPU (None: free).

    ``groups`` names each node's placement group (empty: the whole cluster is one group).
    Immutable: ``with_placement`` and ``without_job`` return new snapshots.
    """

    cluster_id: str
    topology: NodeTopology
    holders: tuple[tuple[str | None, ...], ...]
    groups: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        g = self.topology.gpus
        for rank, node in enumerate(self.holders):
            if len(node) != g:
                raise ValueError(f"holders[{rank}] has {len(node)} GPUs; {self.topology.instance_type} has {g}")
        if self.groups and len(self.groups) != len(self.holders):
            raise ValueError(f"groups names {len(self.groups)} nodes; the cluster has {len(self.holders)}")

    @classmethod
    def empty(cls, cluster_id: str, instance_type: str | NodeTopology, num_nodes: int,
              groups: tuple[str, ...] = ()) -> ClusterSnapshot:
        topo = topology(instance_type) if isinstance(instance_type, str) else instance_type
        if num_nodes < 1:
            raise ValueError(f"num_nodes must be at least 1, got {num_nodes}")
        node: tuple[str | None, ...] = (None,) * topo.gpus
        return cls(cluster_id, topo, (node,) * num_nodes, groups)

    @property
    def num_nodes(self) -> int:
        return len(self.holders)

    @property
    def total_gpus(self) -> int:
        return self.num_nodes * self.topology.gpus

    @cached_property
    def free_masks(self) -> tuple[int, ...]:
        g = self.topology.gpus
        if g <= 8:
            lut, nones = _mask_lut(g), (None,) * g
            return tuple([lut[bytes(map(is_, node, nones))] for node in self.holders])
        return tuple(_mask_of(node) for node in self.holders)

    @cached_property
    def free_gpus(self) -> int:
        return sum(m.bit_count() for m in self.free_masks)

    @cached_property
    def scopes(self) -> tuple[_Scope, ...]:
        """The placement groups in order of first appearance (one scope when no groups are named)."""
        g = self.topology.gpus
        by_name: dict[str, _Scope] = {}
        names = self.groups or ("",) * self.num_nodes
        for rank, mask in enumerate(self.free_masks):
            scope = by_name.get(names[rank])
            if scope is None:
                scope = by_name[names[rank]] = _Scope(names[rank], 0, [[] for _ in range(g + 1)], {})
            scope.by_count[mask.bit_count()].append(rank)
            same = scope.by_mask.get(mask)
            if same is None:
                scope.by_mask[mask] = [rank]
            else:
                same.append(rank)
        for scope in by_name.values():
            scope.free = sum(c * len(ranks) for c, ranks in enumerate(scope.by_count))
        return tuple(by_name.values())

    @cached_property
    def whole(self) -> _Scope:
        if len(self.scopes) == 1:
            return self.scopes[0]
        g = self.topology.gpus
        scope = _Scope("", 0, [[] for _ in range(g + 1)], {})
        for rank, mask in enumerate(self.free_masks):
            c = mask.bit_count()
            scope.free += c
            scope.by_count[c].append(rank)
            scope.by_mask.setdefault(mask, []).append(rank)
        return scope

    def jobs(self) -> dict[str, GangPlacement]:
        held: dict[str, dict[int, list[int]]] = {}
        for rank, node in enumerate(self.holders):
            for gpu, job in enumerate(node):
                if job is not None:
                    held.setdefault(job, {}).setdefault(rank, []).append(gpu)
        return {
            job: GangPlacement(self.cluster_id, tuple((r, tuple(gs)) for r, gs in sorted(nodes.items())))
            for job, nodes in held.items()
        }

    def with_placement(self, job_id: str, placement: GangPlacement) -> ClusterSnapshot:
        """The snapshot after ``job_id`` takes ``placement``; refuses any GPU already held or absent."""
        nodes = list(self.holders)
        for rank, gpus in placement.gpus:
            if not 0 <= rank < len(nodes):
                raise ValueError(f"placement names node {rank}; the cluster has {len(nodes)} nodes")
            node = list(nodes[rank])
            for gpu in gpus:
                if not 0 <= gpu < len(node):
                    raise ValueError(f"placement names GPU {gpu} on node {rank}; nodes have {len(node)} GPUs")
                if node[gpu] is not None:
                    raise ValueError(f"GPU {gpu} on node {rank} is already held by job {node[gpu]!r}")
                node[gpu] = job_id
            nodes[rank] = tuple(node)
        return self._derive(tuple(nodes), {rank for rank, _ in placement.gpus})

    def without_job(self, job_id: str) -> ClusterSnapshot:
        changed = {rank for rank, node in enumerate(self.holders) if job_id in node}
        nodes = list(self.holders)
        for rank in changed:
            nodes[rank] = tuple(None if h == job_id else h for h in nodes[rank])
        return self._derive(tuple(nodes), changed)

    def _derive(self, holders: tuple[tuple[str | None, ...], ...], changed: set[int]) -> ClusterSnapshot:
        """The next snapshot, its index patched for the ``changed`` nodes instead of rebuilt."""
        child = ClusterSnapshot(self.cluster_id, self.topology, holders, self.groups)
        if "free_masks" not in self.__dict__:
            return child
        old = self.free_masks
        masks = list(old)
        for rank in changed:
            masks[rank] = _mask_of(holders[rank])
        child.__dict__["free_masks"] = tuple(masks)
        if "scopes" in self.__dict__:
            names = self.groups or ("",) * self.num_nodes
            scopes = {s.name: s.copy() for s in self.scopes}
            for rank in sorted(changed):
                scopes[names[rank]].move(rank, old[rank], masks[rank])
            child.__dict__["scopes"] = tuple(scopes.values())
        return child


# --- node-level tables -------------------------------------------------------------------------


def _mask_of(node: tuple[str | None, ...]) -> int:
    m = 0
    for i, h in enumerate(node):
        if h is None:
            m |= 1 << i
    return m


@lru_cache(maxsize=16)
def _mask_lut(gpus: int) -> dict[bytes, int]:
    """Free-flags-as-bytes -> bitmask, so a node's mask is one C-level map and a dict lookup."""
    return {bytes((m >> i) & 1 for i in range(gpus)): m for m in range(1 << gpus)}


@lru_cache(maxsize=1 << 16)
def _bits(mask: int) -> tuple[int, ...]:
    return tuple(i for i in range(mask.bit_length()) if mask >> i & 1)


def _lowest(mask: int, k: int) -> int:
    out = 0
    for i in _bits(mask)[:k]:
        out |= 1 << i
    return out


@dataclass(frozen=True, slots=True)
class _NodeTable:
    ring: tuple[float, ...]  # best-ring bottleneck of every GPU subset
    pairs: tuple[float, ...]  # sum of pairwise link bandwidths of every subset
    best: tuple[tuple[int, ...], ...]  # best[free_mask][k] -> subset mask (0 if k > popcount)


@lru_cache(maxsize=64)
def _table(topo: NodeTopology) -> _NodeTable | None:
    """Best k-subset of every free mask, for node types where the choice matters (non-uniform, <= 8 GPUs)."""
    n = topo.gpus
    if topo.uniform or n > 8:
        return None
    ring = ring_table(topo)
    size = 1 << n
    pairs = [0.0] * size
    for mask in range(size):
        members = _bits(mask)
        pairs[mask] = sum(topo.link_gb_s[a][b] for i, a in enumerate(members) for b in members[i + 1:])
    best: list[tuple[int, ...]] = []
    for mask in range(size):
        choice: list[tuple[tuple[float, float, float, float, int], int] | None] = [None] * (n + 1)
        sub = mask
        while True:  # every submask of mask
            k = sub.bit_count()
            left = mask ^ sub
            key = (-ring[sub], -pairs[sub], -ring[left], -pairs[left], sub)
            cur = choice[k]
            if cur is None or key < cur[0]:
                choice[k] = (key, sub)
            if sub == 0:
                break
            sub = (sub - 1) & mask
        best.append(tuple(0 if c is None else c[1] for c in choice))
    return _NodeTable(tuple(ring), tuple(pairs), tuple(best))


def _subset(topo: NodeTopology, mask: int, k: int) -> int:
    table = _table(topo)
    return _lowest(mask, k) if table is None else table.best[mask][k]


def _ring_of(topo: NodeTopology, subset: int) -> float:
    table = _table(topo)
    if table is None:
        return float("inf") if subset.bit_count() < 2 else topo.link_gb_s[0][1]
    return table.ring[subset]


def _result(cluster: ClusterSnapshot, taken: dict[int, int]) -> GangPlacement:
    return GangPlacement(cluster.cluster_id, tuple((r, _bits(m)) for r, m in sorted(taken.items()) if m))


def fewest_nodes(cluster: ClusterSnapshot, gpus: int) -> int | None:
    """The fewest nodes whose free GPUs could hold ``gpus`` right now (None: not enough free)."""
    need = gpus
    used = 0
    counts = [m.bit_count() for m in cluster.free_masks]
    counts.sort(reverse=True)
    for c in counts:
        if need <= 0 or c == 0:
            break
        need -= c
        used += 1
    return used if need <= 0 else None


# --- topology ------------------------------------------------------------------------------------


def _scopes_for(request: PlacementRequest, cluster: ClusterSnapshot, topology_first: bool) -> list[_Scope]:
    """Scopes to try in order: one placement group at a time, then (unless required) the whole cluster.

    ``topology_first``: try single groups, tightest first, even when the request does not ask (a
    gang inside one group talks faster); the baselines only honour a required group level.
    """
    if len(cluster.scopes) == 1 or request.level == LEVEL_NODE:
        return [cluster.whole]
    groups = [s for s in cluster.scopes if s.free >= request.gpus]
    if request.required:  # level is placement_group here
        return sorted(groups, key=lambda s: s.free) if topology_first else groups
    if topology_first:
        return [*sorted(groups, key=lambda s: s.free), cluster.whole]
    return [cluster.whole]


def _single_node(cluster: ClusterSnapshot, scope: _Scope, k: int) -> dict[int, int] | None:
    topo = cluster.topology
    g = topo.gpus
    if _table(topo) is None:
        for c in range(k, g + 1):
            if scope.by_count[c]:
                rank = scope.by_count[c][0]
                return {rank: _lowest(cluster.free_masks[rank], k)}
        return None
    table = _table(topo)
    assert table is not None
    best_key: tuple[float, float, int, float, float, int] | None = None
    best: tuple[int, int] | None = None
    for mask, ranks in scope.by_mask.items():
        c = mask.bit_count()
        if c < k:
            continue
        sub = table.best[mask][k]
        left = mask ^ sub
        key = (-table.ring[sub], -table.pairs[sub], c - k, -table.ring[left], -table.pairs[left], ranks[0])
        if best_key is None or key < best_key:
            best_key, best = key, (ranks[0], sub)
    return None if best is None else {best[0]: best[1]}


def _spread(cluster: ClusterSnapshot, scope: _Scope, k: int) -> dict[int, int] | None:
    """Fewest nodes: whole free counts largest-first, the remainder on the tightest node that holds it."""
    if scope.free < k:
        return None
    g = cluster.topology.gpus
    cursor = [0] * (g + 1)  # next unused rank in each count bucket
    buckets = scope.by_count
    taken: dict[int, int] = {}
    need = k
    while need > 0:
        fit = next((c for c in range(need, g + 1) if cursor[c] < len(buckets[c])), None) if need <= g else None
        if fit is not None:
            rank = buckets[fit][cursor[fit]]
            taken[rank] = _subset(cluster.topology, cluster.free_masks[rank], need)
            return taken
        c = next(c for c in range(g, 0, -1) if cursor[c] < len(buckets[c]))
        rank = buckets[c][cursor[c]]
        cursor[c] += 1
        taken[rank] = cluster.free_masks[rank]
        need -= c
    return taken


def _exact_nodes(cluster: ClusterSnapshot, scope: _Scope, n: int, per_node: int,
                 prefer_links: bool) -> dict[int, int] | None:
    """``n`` distinct nodes with ``per_node`` GPUs each, tightest nodes first."""
    topo = cluster.topology
    masks = [m for m in scope.by_mask if m.bit_count() >= per_node]
    if prefer_links:
        masks.sort(key=lambda m: (m.bit_count(), -_ring_of(topo, _subset(topo, m, per_node)), m))
    else:
        masks.sort(key=lambda m: (m.bit_count(), m))
    chosen: list[tuple[int, int]] = []
    for m in masks:
        for rank in scope.by_mask[m]:
            chosen.append((rank, m))
            if len(chosen) == n:
                return {r: (_subset(topo, mm, per_node) if prefer_links else _lowest(mm, per_node)) for r, mm in chosen}
    return None


def _best_fit_nodes(cluster: ClusterSnapshot, scope: _Scope, split: tuple[int, ...]) -> dict[int, int] | None:
    """One distinct node per part of ``split`` (descending), each the tightest that still holds it."""
    g = cluster.topology.gpus
    cursor = [0] * (g + 1)
    buckets = scope.by_count
    taken: dict[int, int] = {}
    for part in split:
        fit = next((c for c in range(part, g + 1) if cursor[c] < len(buckets[c])), None)
        if fit is None:
            return None
        rank = buckets[fit][cursor[fit]]
        cursor[fit] += 1
        taken[rank] = _subset(cluster.topology, cluster.free_masks[rank], part)
    return taken


def _holes(cluster: ClusterSnapshot, taken: dict[int, int]) -> tuple[int, int]:
    """Whole free nodes the placement breaks into holes, then free GPUs it leaves on the nodes it touches."""
    g = cluster.topology.gpus
    broken = left = 0
    for rank, sub in taken.items():
        free = cluster.free_masks[rank].bit_count()
        rest = free - sub.bit_count()
        broken += free == g and rest > 0
        left += rest
    return broken, left


def _measured_fit(request: PlacementRequest, cluster: ClusterSnapshot, scope: _Scope,
                  cost: MeasuredSplitCost) -> dict[int, int] | None:
    """The measured split that steps fastest, among those within the tolerance the one leaving the
    fewest holes, then on fewest nodes (None: no measured split fits, the caller's rules decide)."""
    g = cluster.topology.gpus
    one_node = request.required and request.level == LEVEL_NODE
    options: list[tuple[float, tuple[int, int, int], dict[int, int]]] = []
    for split, step in cost.splits(request.gpus):
        if split[0] > g or (one_node and len(split) > 1):
            continue
        taken = _single_node(cluster, scope, split[0]) if len(split) == 1 else _best_fit_nodes(cluster, scope, split)
        if taken is not None:
            options.append((step, (*_holes(cluster, taken), len(split)), taken))
    if not options:
        return None
    fastest = min(step for step, _, _ in options)
    near = [o for o in options if o[0] <= fastest * (1 + cost.tolerance)]
    return min(near, key=lambda o: (*o[1], o[0]))[2]


def _required_fail(request: PlacementRequest, cluster: ClusterSnapshot) -> bool:
    """True when a required level can never hold this gang on this cluster's node type."""
    return (request.required and request.level == LEVEL_NODE
            and (request.gpus > cluster.topology.gpus or (request.num_nodes or 1) > 1))


class PlacementPolicy(Protocol):
    """Which GPUs of a cluster a gang takes; None if it does not fit."""

    def __call__(self, request: PlacementRequest, cluster: ClusterSnapshot, /) -> GangPlacement | None: ...


PLACEMENT_POLICIES: Registry[PlacementPolicy] = Registry("placement")


@PLACEMENT_POLICIES.register("topology", default=True)
def topology_aware(request: PlacementRequest, cluster: ClusterSnapshot) -> GangPlacement | None:
    """Least communication cost (fewest nodes, strongest ring), then best fit; see the module doc."""
    if cluster.free_gpus < request.gpus or _required_fail(request, cluster):
        return None
    k = request.gpus
    g = cluster.topology.gpus
    for scope in _scopes_for(request, cluster, topology_first=True):
        if scope.free < k:
            continue
        taken: dict[int, int] | None
        if request.num_nodes is not None:
            taken = _exact_nodes(cluster, scope, request.num_nodes, k // request.num_nodes, prefer_links=True)
        else:
            taken = None if request.measured is None else _measured_fit(request, cluster, scope, request.measured)
            if taken is None and k <= g:
                taken = _single_node(cluster, scope, k)
            if taken is None and not (request.required and request.level == LEVEL_NODE):
                taken = _spread(cluster, scope, k)
        if taken is not None:
            return _result(cluster, taken)
    return None


# --- baselines -----------------------------------------------------------------------------------


@PLACEMENT_POLICIES.register("first_fit")
def first_fit(request: PlacementRequest, cluster: ClusterSnapshot) -> GangPlacement | None:
    """Nodes in rank order, GPUs in index order: the first free ones that make up the gang."""
    if cluster.free_gpus < request.gpus or _required_fail(request, cluster):
        return None
    k = request.gpus
    masks = cluster.free_masks
    for scope in _scopes_for(request, cluster, topology_first=False):
        ranks = sorted(r for bucket in scope.by_count[1:] for r in bucket)
        taken: dict[int, int] = {}
        if request.num_nodes is not None:
            per = k // request.num_nodes
            for r in ranks:
                if masks[r].bit_count() >= per:
                    taken[r] = _lowest(masks[r], per)
                    if len(taken) == request.num_nodes:
                        return _result(cluster, taken)
            continue
        if request.required and request.level == LEVEL_NODE:
            r0 = next((r for r in ranks if masks[r].bit_count() >= k), None)
            if r0 is not None:
                return _result(cluster, {r0: _lowest(masks[r0], k)})
            continue
        need = k
        for r in ranks:
            take = min(need, masks[r].bit_count())
            taken[r] = _lowest(masks[r], take)
            need -= take
            if need == 0:
                return _result(cluster, taken)
    return None


@PLACEMENT_POLICIES.register("random")
def random_fit(request: PlacementRequest, cluster: ClusterSnapshot) -> GangPlacement | None:
    """Free GPUs drawn at random (seeded by the request's seed and job id, so replays repeat)."""
    if cluster.free_gpus < request.gpus or _required_fail(request, cluster):
        return None
    rng = _random.Random(f"{request.seed}:{request.job_id}:{request.gpus}")
    k = request.gpus
    masks = cluster.free_masks
    for scope in _scopes_for(request, cluster, topology_first=False):
        ranks = sorted(r for bucket in scope.by_count[1:] for r in bucket)
        if request.num_nodes is not None:
            per = k // request.num_nodes
            fits = [r for r in ranks if masks[r].bit_count() >= per]
            if len(fits) < request.num_nodes:
                continue
            chosen = rng.sample(fits, request.num_nodes)
            return _result(cluster, {r: _mask(rng.sample(_bits(masks[r]), per)) for r in chosen})
        if request.required and request.level == LEVEL_NODE:
            fits = [r for r in ranks if masks[r].bit_count() >= k]
            if not fits:
                continue
            r0 = rng.choice(fits)
            return _result(cluster, {r0: _mask(rng.sample(_bits(masks[r0]), k))})
        pool = [(r, gpu) for r in ranks for gpu in _bits(masks[r])]
        if len(pool) < k:
            continue
        taken: dict[int, int] = {}
        for r, gpu in rng.sample(pool, k):
            taken[r] = taken.get(r, 0) | 1 << gpu
        return _result(cluster, taken)
    return None


def _mask(gpus: list[int]) -> int:
    m = 0
    for gpu in gpus:
        m |= 1 << gpu
    return m


@PLACEMENT_POLICIES.register("packed_sticky")
def packed_sticky(request: PlacementRequest, cluster: ClusterSnapshot) -> GangPlacement | None:
    """PAL's packed-sticky baseline: keep the previous placement if it is free; else a node with
    exactly or the fewest more free GPUs than needed (lowest GPU indices); else the nodes with the
    most free GPUs first, so the gang spans as few nodes as possible."""
    if cluster.free_gpus < request.gpus or _required_fail(request, cluster):
        return None
    prev = request.previous
    masks = cluster.free_masks
    if prev is not None and prev.gpu_count == request.gpus and all(
        0 <= r < cluster.num_nodes and all(masks[r] >> gpu & 1 for gpu in gpus) for r, gpus in prev.gpus
    ):
        return GangPlacement(cluster.cluster_id, prev.gpus)
    k = request.gpus
    g = cluster.topology.gpus
    for scope in _scopes_for(request, cluster, topology_first=False):
        if scope.free < k:
            continue
        if request.num_nodes is not None:
            taken = _exact_nodes(cluster, scope, request.num_nodes, k // request.num_nodes, prefer_links=False)
            if taken is not None:
                return _result(cluster, taken)
            continue
        if k <= g:
            c = next((c for c in range(k, g + 1) if scope.by_count[c]), None)
            if c is not None:
                r0 = scope.by_count[c][0]
                return _result(cluster, {r0: _lowest(masks[r0], k)})
            if request.required and request.level == LEVEL_NODE:
                continue
        ranks = sorted((r for bucket in scope.by_count[1:] for r in bucket), key=lambda r: (-masks[r].bit_count(), r))
        taken2: dict[int, int] = {}
        need = k
        for r in ranks:
            take = min(need, masks[r].bit_count())
            taken2[r] = _lowest(masks[r], take)
            need -= take
            if need == 0:
                return _result(cluster, taken2)
    return None
