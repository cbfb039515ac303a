"""GPU-sharing placement: the hard rules on tiny clusters with answers worked out by hand, and
properties over random clusters and tasks for every registered policy."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from policies import kinds
from policies.sharing import (
    PlacementRefused,
    SharingCluster,
    SharingNode,
    SharingPlacement,
    SharingRequest,
    TaskShape,
    WorkloadMix,
    expected_fragmentation,
)

POLICIES = kinds.sharing.names()
HALF = TaskShape.of(cpus=1, memory_gb=1, gpus=0.5)
WHOLE = TaskShape.of(cpus=1, memory_gb=1, gpus=1)


def place(name: str, task: TaskShape, cluster: SharingCluster, mix: WorkloadMix | None = None,
          seed: int = 0) -> SharingPlacement | None:
    return kinds.sharing.get(name)(SharingRequest(task, mix or WorkloadMix.of({task: 1}), seed), cluster)


def two_t4() -> SharingCluster:
    return SharingCluster.of([SharingNode("a", 16000, 65536, 2, "T4", 16384),
                              SharingNode("b", 16000, 65536, 2, "T4", 16384)])


def test_registered_with_fgd_as_default() -> None:
    assert set(POLICIES) == {"fgd", "first_fit", "best_fit", "dot_product", "gpu_packing", "gpu_clustering",
                             "random"}
    assert kinds.sharing.default_name() == "fgd"


@pytest.mark.parametrize("name", ["fgd", "best_fit", "gpu_packing", "dot_product", "gpu_clustering"])
@pytest.mark.parametrize("seed", range(5))
def test_a_half_goes_where_the_other_half_is(name: str, seed: int) -> None:
    # Node b GPU 1 already holds a 0.5 task; a second 0.5 fills that GPU and keeps three whole GPUs free.
    cluster = two_t4().with_placement(HALF, SharingPlacement(1, (1,), 500))
    mix = WorkloadMix.of({HALF: 1, WHOLE: 1})
    assert place(name, HALF, cluster, mix, seed) == SharingPlacement(1, (1,), 500)


@pytest.mark.parametrize("seed", range(5))
def test_fgd_packs_a_half_onto_a_half_when_only_halves_are_expected(seed: int) -> None:
    # With halves alone in the mix, both GPUs of node b leave the fragmentation unchanged (0): the
    # tie goes to the GPU left with less, so the other GPU stays whole.
    cluster = two_t4().with_placement(HALF, SharingPlacement(1, (1,), 500))
    assert place("fgd", HALF, cluster, WorkloadMix.of({HALF: 1}), seed) == SharingPlacement(1, (1,), 500)


def test_fgd_measure_by_hand() -> None:
    # Against a mix of half and whole GPUs (equal weights): a GPU with 0.5 left is lost to the
    # whole-GPU tasks (500 milli) but not to the halves, so the expected fragmentation is 250.
    cluster = two_t4().with_placement(HALF, SharingPlacement(0, (0,), 500))
    frag = expected_fragmentation(cluster, WorkloadMix.of({HALF: 1, WHOLE: 1}))
    assert list(frag) == [250.0, 0.0]


def test_fgd_keeps_whole_gpus_whole_for_a_whole_gpu_workload() -> None:
    # Node a: GPU 0 has 0.7 left. A 0.3 task fits there exactly; putting it on a free GPU would leave
    # two broken GPUs for the whole-GPU tasks the mix expects.
    cluster = two_t4().with_placement(TaskShape(1000, 1024, 1, 300), SharingPlacement(0, (0,), 300))
    small = TaskShape(1000, 1024, 1, 300)
    got = place("fgd", small, cluster, WorkloadMix.of({WHOLE: 9, small: 1}))
    assert got == SharingPlacement(0, (0,), 300)


@pytest.mark.parametrize("name", POLICIES)
def test_gpu_type_is_never_broken(name: str) -> None:
    cluster = SharingCluster.of([SharingNode("t4", 64000, 262144, 4, "T4"),
                                 SharingNode("v100", 8000, 32768, 1, "V100M32")])
    task = TaskShape(1000, 1024, 1, 500, gpu_types=("V100M32",))
    for seed in range(5):
        got = place(name, task, cluster, seed=seed)
        assert got is not None and got.node == 1
    cluster = cluster.with_placement(TaskShape(1000, 1024, 1, 1000), SharingPlacement(1, (0,), 1000))
    assert place(name, task, cluster) is None  # the T4s are free, but not the right kind


@pytest.mark.parametrize("name", POLICIES)
def test_cpu_and_memory_are_never_oversubscribed(name: str) -> None:
    # Node a has GPUs free but only 2 cores and 4 GiB left; node b has CPU but no memory.
    cluster = SharingCluster.of([SharingNode("a", 2000, 4096, 2, "T4"), SharingNode("b", 64000, 2048, 2, "T4")])
    assert place(name, TaskShape(3000, 3072, 1, 500), cluster) is None  # a lacks CPU, b memory
    got = place(name, TaskShape(1000, 3072, 1, 500), cluster)
    assert got is not None and got.node == 0
    assert place(name, TaskShape(0, 8192, 0, 0), cluster) is None  # memory: nowhere


@pytest.mark.parametrize("name", POLICIES)
def test_a_fraction_is_never_spread_over_two_gpus(name: str) -> None:
    # 0.4 + 0.4 left on the two GPUs: 0.8 in all, but no single GPU holds a 0.6 task.
    cluster = SharingCluster.of([SharingNode("a", 16000, 65536, 2, "T4")])
    for g in (0, 1):
        cluster = cluster.with_placement(TaskShape(0, 0, 1, 600), SharingPlacement(0, (g,), 600))
    assert place(name, TaskShape(0, 0, 1, 600), cluster) is None
    got = place(name, TaskShape(0, 0, 1, 400), cluster)
    assert got is not None and len(got.gpus) == 1


def test_gpu_memory_is_a_dimension_of_its_own() -> None:
    # GPU 0 has share left (0.5) but only 4 GiB of its 16; a 0.2 task needing 8 GiB goes to GPU 1.
    cluster = SharingCluster.of([SharingNode("a", 16000, 65536, 2, "T4", 16384)])
    cluster = cluster.with_placement(TaskShape(0, 0, 1, 500, 12288), SharingPlacement(0, (0,), 500))
    for name in POLICIES:
        got = place(name, TaskShape(0, 0, 1, 200, 8192), cluster)
        assert got == SharingPlacement(0, (1,), 200), name


def test_the_cluster_refuses_what_breaks_a_rule() -> None:
    cluster = two_t4()
    with pytest.raises(PlacementRefused):
        cluster.with_placement(TaskShape(0, 0, 2, 1000), SharingPlacement(0, (0, 0), 1000))
    with pytest.raises(PlacementRefused):
        cluster.with_placement(TaskShape(20000, 0, 0, 0), SharingPlacement(0, (), 0))
    full = cluster.with_placement(WHOLE, SharingPlacement(0, (0,), 1000))
    with pytest.raises(PlacementRefused):
        full.with_placement(HALF, SharingPlacement(0, (0,), 500))
    with pytest.raises(ValueError):
        TaskShape(0, 0, 2, 500)  # a gang of fractions
    with pytest.raises(ValueError):
        TaskShape.of(gpus=1.5)


def test_whole_gpu_gang_gets_the_tightest_links() -> None:
    # p3.16xlarge (DGX-1 hybrid cube-mesh): GPUs 0-3 are fully NVLinked; 0,1,4,5 are not a clique.
    cluster = SharingCluster.of([SharingNode("p3", 64000, 488000, 8, "V100", 16384, "p3.16xlarge")])
    got = place("fgd", TaskShape(0, 0, 4, 1000), cluster)
    assert got is not None and set(got.gpus) in ({0, 1, 2, 3}, {4, 5, 6, 7})


def test_same_request_same_answer() -> None:
    cluster = SharingCluster.of([SharingNode(f"n{i}", 16000, 65536, 2, "T4") for i in range(6)])
    for name in POLICIES:
        assert place(name, HALF, cluster, seed=7) == place(name, HALF, cluster, seed=7)


nodes_st = st.lists(st.tuples(st.integers(0, 16000), st.integers(0, 65536), st.integers(0, 8),
                              st.sampled_from(["T4", "V100"])), min_size=1, max_size=5)
task_st = st.one_of(
    st.builds(lambda c, m: TaskShape(c, m, 0, 0), st.integers(0, 9000), st.integers(0, 30000)),
    st.builds(lambda c, m, s, t: TaskShape(c, m, 1, s, 0, t), st.integers(0, 9000), st.integers(0, 30000),
              st.integers(1, 1000), st.sampled_from([(), ("T4",), ("V100",)])),
    st.builds(lambda c, k: TaskShape(c, 0, k, 1000), st.integers(0, 9000), st.integers(1, 8)),
)


@settings(max_examples=60, deadline=None)
@given(nodes_st, st.lists(task_st, min_size=1, max_size=25), st.sampled_from(POLICIES), st.integers(0, 99))
def test_no_policy_ever_allocates_more_than_a_node_has(raw: list[tuple[int, int, int, str]], tasks: list[TaskShape],
                                                        name: str, seed: int) -> None:
    nodes = [SharingNode(f"n{i}", max(c, 1), max(m, 1), g, model) for i, (c, m, g, model) in enumerate(raw)]
    cluster = SharingCluster.of(nodes)
    policy = kinds.sharing.get(name)
    counts: dict[TaskShape, float] = {}
    held: list[tuple[TaskShape, SharingPlacement]] = []
    for i, task in enumerate(tasks):
        counts[task] = counts.get(task, 0) + 1
        got = policy(SharingRequest(task, WorkloadMix.of(counts), seed + i), cluster)
        if got is None:
            continue
        cluster.check(task, got)  # the policy's answer honours every rule on the state it saw
        cluster = cluster.with_placement(task, got)
        held.append((task, got))
    # Books kept independently of the cluster's arrays: nothing is ever over a node's capacity.
    for n, node in enumerate(nodes):
        mine = [(t, p) for t, p in held if p.node == n]
        assert sum(t.cpu_milli for t, _ in mine) <= node.cpu_milli
        assert sum(t.memory_mib for t, _ in mine) <= node.memory_mib
        for g in range(node.gpus):
            assert sum(t.gpu_milli for t, p in mine if g in p.gpus) <= 1000
        for t, p in mine:
            assert all(0 <= g < node.gpus for g in p.gpus)
            assert len(p.gpus) == t.gpus
            assert not t.gpus or not t.gpu_types or node.gpu_model in t.gpu_types


def three_t4() -> SharingCluster:
    return SharingCluster.of([SharingNode(name, 16000, 65536, 2, "T4", 16384) for name in "abc"])


@pytest.mark.parametrize("seed", range(5))
def test_gpu_clustering_groups_every_fraction_as_one_kind(seed: int) -> None:
    # As the FGD simulator tags pods: any fraction is "share-gpu". Node a runs a 0.3 task, node b
    # a whole-GPU task, node c nothing. A 0.5 task joins a (the only kind there is its own: band 3,
    # 75 + 25 * (8000 - 1700) // 8000 = 94), not the idle c (25 + 25 * 6000 // 8000 = 43).
    third = TaskShape(1000, 1024, 1, 300)
    cluster = three_t4().with_placement(third, SharingPlacement(0, (0,), 300))
    cluster = cluster.with_placement(WHOLE, SharingPlacement(1, (0,), 1000))
    assert place("gpu_clustering", HALF, cluster, seed=seed).node == 0


def test_gpu_packing_keeps_the_simulators_integer_ties() -> None:
    # A half fits on a shared GPU of node a (0.55 left) and of node b (0.58 left): both score
    # 100 - 55 // 10 = 100 - 58 // 10 = 95 in the simulator's integer arithmetic, so kube-scheduler's
    # random tie-break picks either; node c (empty: max(33 - 2, 2) = 31) never.
    cluster = three_t4().with_placement(TaskShape(1000, 1024, 1, 450), SharingPlacement(0, (0,), 450))
    cluster = cluster.with_placement(TaskShape(1000, 1024, 1, 420), SharingPlacement(1, (1,), 420))
    chosen = {place("gpu_packing", HALF, cluster, seed=seed) for seed in range(20)}
    assert chosen == {SharingPlacement(0, (0,), 500), SharingPlacement(1, (1,), 500)}


@pytest.mark.parametrize("seed", range(5))
def test_fgd_keeps_the_only_t4s_for_the_tasks_that_need_a_t4(seed: int) -> None:
    # A 2-GPU T4 node and a 4-GPU G2 node. Expected: 4-GPU tasks of any model (0.3 of the GPU demand),
    # 1-GPU tasks of any model (0.1) and 1-GPU tasks that need a T4 (0.6). A 1-GPU task of any model
    # arrives. Weighed against the whole cluster, the T4 tasks' 0.6 is less than what taking a G2
    # GPU costs the 4-GPU tasks (growth G2: 3000 x 0.3 - 1000 x 0.6 = 300 > T4: -1000 x 0.3), so the
    # task would take a T4 and one of the next two T4 tasks would find none. Weighed on the GPUs they
    # can use (T4s are a third of the free GPUs: 0.6 x 3 ** 1.5 = 3.1), the T4 is worth more: the task
    # goes to the G2 (growth 900 - 3100 < -300) and both T4 tasks fit.
    t4, g2 = SharingNode("t4", 16000, 65536, 2, "T4"), SharingNode("g2", 16000, 65536, 4, "G2")
    cluster = SharingCluster.of([t4, g2])
    four = TaskShape.of(gpus=4)
    any_one = TaskShape.of(gpus=1)
    t4_one = TaskShape.of(gpus=1, gpu_types=("T4",))
    mix = WorkloadMix((four, any_one, t4_one), (0.3, 0.1, 0.6))
    first = kinds.sharing.get("fgd")(SharingRequest(any_one, mix, seed), cluster)
    assert first is not None and first.node == 1
    cluster = cluster.with_placement(any_one, first)
    for _ in range(2):
        placed = kinds.sharing.get("fgd")(SharingRequest(t4_one, mix, seed), cluster)
        assert placed is not None and placed.node == 0
        cluster = cluster.with_placement(t4_one, placed)
    # Without the T4 tasks in the mix the measure has no reason to spare the T4: it keeps the G2 whole
    # for the 4-GPU tasks.
    alone = kinds.sharing.get("fgd")(SharingRequest(any_one, WorkloadMix((four, any_one), (0.3, 0.1)), seed),
                                           SharingCluster.of([t4, g2]))
    assert alone is not None and alone.node == 0


@pytest.mark.parametrize("name", POLICIES)
def test_every_policy_keeps_off_the_nodes_a_request_avoids(name: str) -> None:
    # A gang of fractions takes one share per node: the nodes its other shares hold are avoided.
    cluster = two_t4().with_placement(HALF, SharingPlacement(0, (0,), 500))
    for seed in range(5):
        placed = kinds.sharing.get(name)(SharingRequest(HALF, WorkloadMix.of({HALF: 1}), seed,
                                                              avoid_nodes=frozenset({0})), cluster)
        assert placed is not None and placed.node == 1
    assert kinds.sharing.get(name)(SharingRequest(HALF, WorkloadMix.of({HALF: 1}), 0,
                                                        avoid_nodes=frozenset({0, 1, 7})), cluster) is None
