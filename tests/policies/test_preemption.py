"""Checkpoint-aware preemption: cheapest victims first, never when the work lost exceeds the gain."""

from __future__ import annotations

import math

import pytest

from policies import kinds
from policies.gang import GangPlacement
from policies.placement import ClusterSnapshot, PlacementRequest
from policies.preemption import PreemptionRequest, RunningGang, plan_preemption, victim_order

BATCH, TRAINING, INFERENCE = 100, 500, 1000


def cluster(jobs: dict[str, tuple[tuple[int, tuple[int, ...]], ...]], nodes: int = 1) -> ClusterSnapshot:
    snap = ClusterSnapshot.empty("c1", "p4d.24xlarge", nodes)
    for job, gpus in jobs.items():
        snap = snap.with_placement(job, GangPlacement("c1", gpus))
    return snap


def test_registered_as_default() -> None:
    assert kinds.preemption.get() is plan_preemption
    assert kinds.preemption.default_name() == "checkpoint_aware"


def test_picks_the_victim_with_least_work_lost() -> None:
    snap = cluster({"old": ((0, (0, 1, 2, 3)),), "fresh": ((0, (4, 5, 6, 7)),)})
    running = (RunningGang("old", BATCH, 4, 1800.0), RunningGang("fresh", BATCH, 4, 60.0))
    plan = plan_preemption(PreemptionRequest(PlacementRequest("new", 4), TRAINING, 3600.0), snap, running)
    assert plan is not None
    assert plan.victims == ("fresh",)
    assert plan.placement.gpus == ((0, (4, 5, 6, 7)),)
    assert plan.work_lost_gpu_s == 240.0 and plan.gain_gpu_s == 4 * 3600.0


def test_lower_priority_goes_first_even_when_it_loses_more() -> None:
    snap = cluster({"batch": ((0, (0, 1, 2, 3)),), "train": ((0, (4, 5, 6, 7)),)})
    running = (RunningGang("batch", BATCH, 4, 900.0), RunningGang("train", TRAINING, 4, 10.0))
    req = PreemptionRequest(PlacementRequest("new", 4), INFERENCE, 3600.0)
    assert [r.job_id for r in victim_order(req, running)] == ["batch", "train"]
    plan = plan_preemption(req, snap, running)
    assert plan is not None and plan.victims == ("batch",)


def test_refuses_when_work_lost_exceeds_gain() -> None:
    snap = cluster({"a": ((0, tuple(range(8))),)})
    running = (RunningGang("a", BATCH, 8, 3000.0, restart_overhead_s=600.0),)  # loses 8 x 3600
    just_worth = PreemptionRequest(PlacementRequest("new", 8), TRAINING, 3600.0)  # gains 8 x 3600
    plan = plan_preemption(just_worth, snap, running)
    assert plan is not None and plan.victims == ("a",)
    not_worth = PreemptionRequest(PlacementRequest("new", 8), TRAINING, 3599.0)
    assert plan_preemption(not_worth, snap, running) is None


def test_never_preempts_equal_or_higher_priority() -> None:
    snap = cluster({"a": ((0, tuple(range(8))),)})
    running = (RunningGang("a", TRAINING, 8, 0.0),)
    assert plan_preemption(PreemptionRequest(PlacementRequest("new", 8), TRAINING, math.inf), snap, running) is None


def test_no_plan_when_the_gang_fits_already() -> None:
    snap = cluster({"a": ((0, (0, 1)),)})
    running = (RunningGang("a", BATCH, 2, 0.0),)
    assert plan_preemption(PreemptionRequest(PlacementRequest("new", 4), TRAINING, math.inf), snap, running) is None


def test_victims_the_placement_does_not_need_are_spared() -> None:
    # "cheap" is considered first but freeing it does not make room for a whole node; "node1" does.
    snap = cluster({"cheap": ((0, (0, 1)),), "big": ((0, (2, 3, 4, 5, 6, 7)),), "node1": ((1, tuple(range(8))),)},
                   nodes=2)
    running = (RunningGang("cheap", BATCH, 2, 10.0), RunningGang("big", BATCH, 6, 5000.0),
               RunningGang("node1", BATCH, 8, 100.0))
    req = PreemptionRequest(PlacementRequest("new", 8, level="node", required=True), TRAINING, 3600.0)
    plan = plan_preemption(req, snap, running)
    assert plan is not None
    assert plan.victims == ("node1",)
    assert plan.placement.nodes == (1,)


def test_bad_inputs_name_the_field() -> None:
    with pytest.raises(ValueError, match="seconds_since_checkpoint"):
        RunningGang("a", BATCH, 2, -1.0)
    with pytest.raises(ValueError, match="wait_avoided_s"):
        PreemptionRequest(PlacementRequest("a", 1), BATCH, -5.0)


def test_a_reclaim_takes_the_smaller_gang_not_the_large_one_just_started() -> None:
    # The borrowers hold a 48-GPU gang started a minute ago and a 16-GPU one 25 minutes past its checkpoint;
    # the owner needs 4 more GPUs. By work lost alone the fresh large gang goes (48 x 120 < 16 x 1560 GPU-s),
    # and must then find 48 GPUs free at once again; a reclaim takes the smaller one.
    snap = ClusterSnapshot.empty("c1", "p4d.24xlarge", 8)
    snap = snap.with_placement("large", GangPlacement("c1", tuple((n, tuple(range(8))) for n in range(6))))
    snap = snap.with_placement("small", GangPlacement("c1", tuple((n, tuple(range(8))) for n in range(6, 8))))
    running = (RunningGang("large", 0, 48, 60.0, restart_overhead_s=60.0),
               RunningGang("small", 0, 16, 1500.0, restart_overhead_s=60.0))
    assert running[0].work_lost_gpu_s < running[1].work_lost_gpu_s
    by_work_lost = plan_preemption(PreemptionRequest(PlacementRequest("owner", 4), 1, math.inf), snap, running)
    assert by_work_lost is not None and by_work_lost.victims == ("large",)
    reclaim = PreemptionRequest(PlacementRequest("owner", 4), 1, math.inf, reclaim=True)
    assert [r.job_id for r in victim_order(reclaim, running)] == ["small", "large"]
    plan = plan_preemption(reclaim, snap, running)
    assert plan is not None and plan.victims == ("small",)
    assert plan.work_lost_gpu_s == 16 * 1560.0


def test_a_reclaim_still_takes_a_large_gang_just_started_when_the_small_ones_do_not_free_enough() -> None:
    # The owner needs 40 GPUs: the 16-GPU gang is not enough, so the large one goes, and only it (the small
    # one is then not needed and is spared).
    snap = ClusterSnapshot.empty("c1", "p4d.24xlarge", 8)
    snap = snap.with_placement("large", GangPlacement("c1", tuple((n, tuple(range(8))) for n in range(6))))
    snap = snap.with_placement("small", GangPlacement("c1", tuple((n, tuple(range(8))) for n in range(6, 8))))
    running = (RunningGang("large", 0, 48, 60.0, restart_overhead_s=60.0),
               RunningGang("small", 0, 16, 1500.0, restart_overhead_s=60.0))
    plan = plan_preemption(PreemptionRequest(PlacementRequest("owner", 40), 1, math.inf, reclaim=True), snap, running)
    assert plan is not None and plan.victims == ("large",)
    # Among gangs of one size, the least work lost still goes first.
    same = (RunningGang("old", 0, 4, 1500.0), RunningGang("fresh", 0, 4, 60.0), RunningGang("one", 0, 1, 3000.0))
    reclaim = PreemptionRequest(PlacementRequest("owner", 4), 1, math.inf, reclaim=True)
    assert [r.job_id for r in victim_order(reclaim, same)] == ["one", "fresh", "old"]
