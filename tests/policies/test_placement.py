"""Placement policies on real node topologies: NVLink-aware choice, no needless splits, all or nothing."""

from __future__ import annotations

from itertools import combinations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from policies import kinds
from policies.gang import GangPlacement
from policies.placement import (
    ClusterSnapshot,
    MeasuredSplitCost,
    PlacementRequest,
    fewest_nodes,
    first_fit,
    packed_sticky,
    random_fit,
    topology_aware,
)
from providers.topology import NVLINK

POLICIES = ["topology", "first_fit", "random", "packed_sticky"]


def occupied(instance_type: str, busy: dict[int, tuple[int, ...]], nodes: int = 1,
             groups: tuple[str, ...] = ()) -> ClusterSnapshot:
    snap = ClusterSnapshot.empty("c1", instance_type, nodes, groups)
    for rank, gpus in busy.items():
        snap = snap.with_placement(f"busy{rank}", GangPlacement("c1", ((rank, gpus),)))
    return snap


def gpus_of(p: GangPlacement) -> list[tuple[int, int]]:
    return [(r, g) for r, gs in p.gpus for g in gs]


def all_nvlinked(snap: ClusterSnapshot, p: GangPlacement) -> bool:
    (_, gpus), = p.gpus
    return all(snap.topology.link_kind[a][b] == NVLINK for a, b in combinations(gpus, 2))


def test_registry_knows_every_policy_and_topology_is_default() -> None:
    assert kinds.placement.names() == sorted(POLICIES)
    assert kinds.placement.default_name() == "topology"
    assert kinds.placement.get() is topology_aware


def test_p3_two_gpu_job_gets_an_nvlink_pair_where_first_fit_does_not() -> None:
    snap = occupied("p3.16xlarge", {0: (1, 2, 3, 4)})  # free: 0, 5, 6, 7
    req = PlacementRequest("j", 2)
    ours = topology_aware(req, snap)
    assert ours is not None and all_nvlinked(snap, ours)
    assert ours.gpus == ((0, (5, 6)),)  # the double-link pair, not the single-link 5-7 or 6-7
    naive = first_fit(req, snap)
    assert naive is not None and not all_nvlinked(snap, naive)  # 0 and 5 share no NVLink


def test_p3_two_gpu_job_on_empty_node_takes_a_double_link() -> None:
    snap = ClusterSnapshot.empty("c1", "p3.16xlarge", 1)
    p = topology_aware(PlacementRequest("j", 2), snap)
    assert p is not None
    (_, (a, b)), = p.gpus
    assert snap.topology.link_gb_s[a][b] == 50.0


def test_p3_four_gpu_job_gets_a_fully_nvlinked_quad() -> None:
    snap = occupied("p3.16xlarge", {0: (0,)})  # free 1..7: only 4-5-6-7 is a full NVLink quad
    req = PlacementRequest("j", 4)
    ours = topology_aware(req, snap)
    assert ours == GangPlacement("c1", ((0, (4, 5, 6, 7)),))
    assert all_nvlinked(snap, ours)
    naive = first_fit(req, snap)
    assert naive is not None and not all_nvlinked(snap, naive)


def test_no_split_when_one_node_can_hold_the_gang() -> None:
    snap = occupied("p4d.24xlarge", {0: (0, 1, 2, 3, 4), 1: (0, 1)}, nodes=3)  # free 3, 6, 8
    for k in (3, 5, 6, 8):
        p = topology_aware(PlacementRequest("j", k), snap)
        assert p is not None and len(p.nodes) == 1, k
    # best fit: the 5-GPU gang takes the 6-free node and leaves the empty node whole
    assert topology_aware(PlacementRequest("j", 5), snap).nodes == (1,)  # type: ignore[union-attr]
    assert packed_sticky(PlacementRequest("j", 5), snap).nodes == (1,)  # type: ignore[union-attr]


def test_bigger_gang_spans_fewest_nodes_with_best_fit_remainder() -> None:
    snap = occupied("p4d.24xlarge", {0: (0, 1, 2, 3), 1: (0, 1)}, nodes=3)  # free 4, 6, 8
    p = topology_aware(PlacementRequest("j", 12), snap)
    assert p is not None and p.nodes == (0, 2)  # 8 + 4: the 6-free node stays as a hole
    assert fewest_nodes(snap, 12) == 2


@pytest.mark.parametrize("policy", POLICIES)
def test_gang_never_gets_part_of_its_gpus(policy: str) -> None:
    place = kinds.placement.get(policy)
    snap = occupied("p4d.24xlarge", {0: (0, 1, 2, 3, 4, 5), 1: (0,)}, nodes=2)  # 9 free
    assert place(PlacementRequest("j", 10), snap) is None
    p = place(PlacementRequest("j", 9), snap)
    assert p is not None and p.gpu_count == 9


@pytest.mark.parametrize("policy", POLICIES)
def test_required_node_level_refuses_a_split(policy: str) -> None:
    place = kinds.placement.get(policy)
    snap = occupied("p4d.24xlarge", {0: (0, 1, 2, 3, 4), 1: (0, 1, 2, 3, 4)}, nodes=2)  # 3 + 3 free
    assert place(PlacementRequest("j", 4, level="node", required=True), snap) is None
    preferred = place(PlacementRequest("j", 4, level="node"), snap)
    assert preferred is not None and len(preferred.nodes) == 2
    empty = ClusterSnapshot.empty("c", "p4d.24xlarge", 2)
    assert place(PlacementRequest("j", 16, level="node", required=True), empty) is None


@pytest.mark.parametrize("policy", POLICIES)
def test_required_placement_group_keeps_the_gang_in_one_group(policy: str) -> None:
    place = kinds.placement.get(policy)
    snap = occupied("p4d.24xlarge", {0: (0, 1, 2, 3), 2: (0, 1, 2, 3)}, nodes=4, groups=("a", "a", "b", "b"))
    req = PlacementRequest("j", 12, level="placement_group", required=True)
    p = place(req, snap)
    assert p is not None and {snap.groups[r] for r in p.nodes} in ({"a"}, {"b"})
    assert place(PlacementRequest("j", 13, level="placement_group", required=True), snap) is None
    spanning = place(PlacementRequest("j", 13, level="placement_group"), snap)
    assert spanning is not None and {snap.groups[r] for r in spanning.nodes} == {"a", "b"}


@pytest.mark.parametrize("policy", POLICIES)
def test_exact_nodes_shape(policy: str) -> None:
    place = kinds.placement.get(policy)
    snap = occupied("p4d.24xlarge", {0: (0, 1, 2, 3, 4, 5), 1: (0, 1)}, nodes=3)  # free 2, 6, 8
    p = place(PlacementRequest("j", 8, num_nodes=2), snap)
    assert p is not None and sorted(len(g) for _, g in p.gpus) == [4, 4]
    assert place(PlacementRequest("j", 15, num_nodes=3), snap) is None


def test_topology_exact_shape_uses_the_tightest_nodes() -> None:
    snap = occupied("p4d.24xlarge", {0: (0, 1, 2, 3, 4, 5), 1: (0, 1)}, nodes=3)  # free 2, 6, 8
    assert topology_aware(PlacementRequest("j", 8, num_nodes=2), snap).nodes == (1, 2)  # type: ignore[union-attr]
    assert topology_aware(PlacementRequest("j", 4, num_nodes=2), snap).nodes == (0, 1)  # type: ignore[union-attr]


def test_packed_sticky_keeps_its_previous_gpus_when_free() -> None:
    snap = ClusterSnapshot.empty("c1", "p4d.24xlarge", 2)
    previous = GangPlacement("old", ((1, (2, 3)),))
    assert packed_sticky(PlacementRequest("j", 2, previous=previous), snap) == GangPlacement("c1", ((1, (2, 3)),))
    taken = snap.with_placement("x", GangPlacement("c1", ((1, (3,)),)))
    assert packed_sticky(PlacementRequest("j", 2, previous=previous), taken) != GangPlacement("c1", ((1, (2, 3)),))


def test_random_is_deterministic_given_the_request() -> None:
    snap = ClusterSnapshot.empty("c1", "p4d.24xlarge", 4)
    a = random_fit(PlacementRequest("j", 5, seed=3), snap)
    assert a == random_fit(PlacementRequest("j", 5, seed=3), snap)
    others = {random_fit(PlacementRequest("j", 5, seed=s), snap) for s in range(8)}
    assert len(others) > 1


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [({"gpus": 0}, "gpus"), ({"gpus": 6, "num_nodes": 4}, "num_nodes"), ({"gpus": 2, "level": "rack"}, "level")],
)
def test_bad_requests_name_the_field(kwargs: dict[str, object], field: str) -> None:
    with pytest.raises(ValueError, match=field):
        PlacementRequest("j", **kwargs)  # type: ignore[arg-type]


def test_snapshot_refuses_a_gpu_already_held() -> None:
    snap = occupied("p4d.24xlarge", {0: (3,)})
    with pytest.raises(ValueError, match="GPU 3 on node 0 is already held"):
        snap.with_placement("j", GangPlacement("c1", ((0, (2, 3)),)))


OPS = st.lists(
    st.tuples(st.sampled_from(POLICIES), st.integers(1, 20), st.booleans(), st.integers(0, 10**6)),
    min_size=1,
    max_size=40,
)


@settings(max_examples=60, deadline=None)
@given(instance=st.sampled_from(["p3.16xlarge", "p4d.24xlarge", "g5.12xlarge"]), nodes=st.integers(1, 4), ops=OPS)
def test_no_gpu_is_ever_given_twice_and_freed_gpus_are_reused(instance: str, nodes: int,
                                                             ops: list[tuple[str, int, bool, int]]) -> None:
    snap = ClusterSnapshot.empty("c1", instance, nodes)
    running: list[str] = []
    for n, (policy, k, release, pick) in enumerate(ops):
        if release and running:
            job = running.pop(pick % len(running))
            before = snap.free_gpus
            held = snap.jobs()[job].gpu_count
            snap = snap.without_job(job)
            assert snap.free_gpus == before + held
            continue
        job = f"j{n}"
        p = kinds.placement.get(policy)(PlacementRequest(job, k, seed=pick), snap)
        if k > snap.free_gpus:
            assert p is None
            continue
        # Unconstrained gangs fit whenever enough GPUs are free, freed ones included.
        assert p is not None and p.gpu_count == k
        assert len(set(gpus_of(p))) == k
        free = {(r, g) for r, node in enumerate(snap.holders) for g, h in enumerate(node) if h is None}
        assert set(gpus_of(p)) <= free
        if policy == "topology" and k <= snap.topology.gpus and any(
            m.bit_count() >= k for m in snap.free_masks
        ):
            assert len(p.nodes) == 1
        snap = snap.with_placement(job, p)  # raises if any GPU were already held
        running.append(job)
    assert set(snap.jobs()) == set(running)
    # The index patched along the way equals one built from scratch.
    fresh = ClusterSnapshot(snap.cluster_id, snap.topology, snap.holders, snap.groups)
    assert snap.free_masks == fresh.free_masks
    assert [(s.free, s.by_count, s.by_mask) for s in snap.scopes] == [
        (s.free, s.by_count, s.by_mask) for s in fresh.scopes
    ]
    assert snap.free_gpus == snap.total_gpus - sum(p.gpu_count for p in snap.jobs().values())


@pytest.mark.parametrize("policy", POLICIES)
def test_a_full_cluster_gives_freed_gpus_to_the_next_gang(policy: str) -> None:
    place = kinds.placement.get(policy)
    snap = occupied("p3.16xlarge", {0: (0, 1, 2, 3, 4, 5, 6, 7), 1: (0, 1, 2, 3, 4, 5, 6, 7)}, nodes=2)
    assert place(PlacementRequest("next", 8), snap) is None
    freed = snap.without_job("busy1")
    assert place(PlacementRequest("next", 8), freed) == GangPlacement("c1", ((1, tuple(range(8))),))


# --- measured step times per split ---------------------------------------------------------------

SPREAD_FASTER = MeasuredSplitCost.of({(8,): 1.10, (4, 4): 1.00, (6, 2): 1.05})
PACK_FASTER = MeasuredSplitCost.of({(8,): 1.00, (4, 4): 1.10, (6, 2): 1.05})


def splits_of(p: GangPlacement) -> tuple[int, ...]:
    return tuple(sorted((len(g) for _, g in p.gpus), reverse=True))


def test_measured_spread_beats_packing_on_empty_nodes() -> None:
    snap = ClusterSnapshot.empty("c1", "p4d.24xlarge", 2)
    spread = topology_aware(PlacementRequest("j", 8, measured=SPREAD_FASTER), snap)
    assert spread is not None and splits_of(spread) == (4, 4)
    packed = topology_aware(PlacementRequest("j", 8, measured=PACK_FASTER), snap)
    assert packed is not None and splits_of(packed) == (8,)
    assert topology_aware(PlacementRequest("j", 8), snap) == packed  # unmeasured: the rules pack it


def test_measured_spread_fills_two_half_free_nodes_and_keeps_the_empty_one_whole() -> None:
    snap = occupied("p4d.24xlarge", {0: (0, 1, 2, 3), 1: (4, 5, 6, 7)}, nodes=3)  # free 4, 4, 8
    spread = topology_aware(PlacementRequest("j", 8, measured=SPREAD_FASTER), snap)
    assert spread == GangPlacement("c1", ((0, (4, 5, 6, 7)), (1, (0, 1, 2, 3))))
    packed = topology_aware(PlacementRequest("j", 8, measured=PACK_FASTER), snap)
    assert packed is not None and packed.nodes == (2,)


def test_measured_split_on_p3_keeps_each_part_nvlinked() -> None:
    snap = ClusterSnapshot.empty("c1", "p3.16xlarge", 2)
    p = topology_aware(PlacementRequest("j", 8, measured=SPREAD_FASTER), snap)
    assert p is not None and splits_of(p) == (4, 4)
    for rank, gpus in p.gpus:
        assert all(snap.topology.link_kind[a][b] == NVLINK for a, b in combinations(gpus, 2)), rank


def test_measured_splits_within_tolerance_go_to_the_fewest_holes() -> None:
    nearly = {(8,): 1.01, (4, 4): 1.00}
    snap = ClusterSnapshot.empty("c1", "p4d.24xlarge", 2)
    exact = topology_aware(PlacementRequest("j", 8, measured=MeasuredSplitCost.of(nearly)), snap)
    assert exact is not None and splits_of(exact) == (4, 4)
    tolerant = topology_aware(PlacementRequest("j", 8, measured=MeasuredSplitCost.of(nearly, 0.02)), snap)
    assert tolerant is not None and splits_of(tolerant) == (8,)  # 4 + 4 would break both whole nodes


def test_the_fastest_measured_split_the_free_gpus_allow_wins() -> None:
    snap = occupied("p4d.24xlarge", {0: (0, 1, 2, 3, 4, 5), 1: (0, 1, 2, 3, 4, 5)}, nodes=3)  # free 2, 2, 8
    p = topology_aware(PlacementRequest("j", 8, measured=SPREAD_FASTER), snap)
    # 4 + 4 needs two nodes with 4 free; 6 + 2 (faster than 8) fits the whole node and a 2-free one.
    assert p is not None and splits_of(p) == (6, 2) and set(p.nodes) == {0, 2}


def test_unmeasured_splits_are_left_to_the_rules() -> None:
    snap = occupied("p4d.24xlarge", {0: (0, 1, 2, 3, 4), 1: (0, 1, 2, 3, 4)}, nodes=3)  # free 3, 3, 8
    only_spread = MeasuredSplitCost.of({(4, 4): 0.5})  # cannot fit: two nodes with 4 free
    p = topology_aware(PlacementRequest("j", 8, measured=only_spread), snap)
    assert p == topology_aware(PlacementRequest("j", 8), snap) == GangPlacement("c1", ((2, tuple(range(8))),))
    # a measured gang bigger than two nodes' worth (none of its splits measured) is placed as before
    big = topology_aware(PlacementRequest("j", 14, measured=SPREAD_FASTER), snap)
    assert big == topology_aware(PlacementRequest("j", 14), snap)


def test_a_required_node_level_binds_despite_faster_measured_splits() -> None:
    snap = ClusterSnapshot.empty("c1", "p4d.24xlarge", 2)
    p = topology_aware(PlacementRequest("j", 8, level="node", required=True, measured=SPREAD_FASTER), snap)
    assert p is not None and splits_of(p) == (8,)


@pytest.mark.parametrize("policy", ["first_fit", "random", "packed_sticky"])
def test_baselines_ignore_measurements(policy: str) -> None:
    place = kinds.placement.get(policy)
    snap = occupied("p4d.24xlarge", {0: (0, 1, 2, 3)}, nodes=3)
    for measured in (SPREAD_FASTER, PACK_FASTER):
        assert place(PlacementRequest("j", 8, measured=measured), snap) == place(PlacementRequest("j", 8), snap)


@settings(max_examples=60, deadline=None)
@given(instance=st.sampled_from(["p3.16xlarge", "p4d.24xlarge"]), nodes=st.integers(1, 4),
       busy=st.lists(st.integers(0, 255), min_size=4, max_size=4), k=st.integers(1, 20))
def test_measurements_of_other_gang_sizes_change_nothing(instance: str, nodes: int, busy: list[int], k: int) -> None:
    snap = occupied(instance, {r: tuple(g for g in range(8) if busy[r] >> g & 1) for r in range(nodes)
                               if busy[r]}, nodes)
    other = MeasuredSplitCost.of({(c,) if c <= 8 else (8, c - 8): 1.0 for c in range(1, 17) if c != k})
    unmeasured = topology_aware(PlacementRequest("j", k), snap)
    assert topology_aware(PlacementRequest("j", k, measured=other), snap) == unmeasured


@pytest.mark.parametrize(
    ("steps", "match"),
    [
        ((((2, 4), 1.0),), "descending"),
        ((((0,), 1.0),), "positive GPU counts"),
        ((((4,), 0.0),), "positive, got"),
        ((((4,), 1.0), ((4,), 1.1)), "twice"),
    ],
)
def test_bad_measurements_say_what_is_wrong(steps: tuple[tuple[tuple[int, ...], float], ...], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        MeasuredSplitCost(steps)
    with pytest.raises(ValueError, match="tolerance"):
        MeasuredSplitCost((), tolerance=1.0)
