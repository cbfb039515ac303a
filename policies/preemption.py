"""Preemption inside a cluster: whom a higher-priority gang that does not fit may displace.

Every policy is ``policy(request: PreemptionRequest, cluster: ClusterSnapshot,
running: tuple[RunningGang, ...]) -> PreemptionPlan | None``, pure; ``None`` means preempt nobody.

``checkpoint_aware`` (the default):

- only gangs of strictly lower priority than the preemptor are candidates;
- candidates are taken in order of priority (lowest first), then work lost (least first), then job
  id, until the preemptor's placement fits on the GPUs they free; victims the placement turns out
  not to need are then dropped again, the most expensive first;
- it never preempts when the work lost exceeds what the preemptor gains.

A fair-share reclaim (``PreemptionRequest.reclaim``) takes the borrowers' smallest gangs first, the
least work lost only among gangs of one size: a requeued gang restarts only once all its GPUs are
free at once, the later the more it needs, and pays its restart on each of them; by work lost alone
a large gang that has just started (it has lost nothing since its checkpoint) would be the first
taken, and wait again for a place its size rarely finds.

Both sides are measured in GPU-seconds:

- work lost by a victim = its GPUs x (seconds since its last completed checkpoint + its restart
  overhead): the progress it must redo plus the time to checkpoint, requeue and restore;
- gain of the preemptor = its GPUs x ``wait_avoided_s``: the seconds it would otherwise wait for
  enough GPUs to free up on their own (the caller's estimate, e.g. the earliest time the running
  gangs' expected ends free enough GPUs; ``math.inf`` if no end is known).

Priorities are plain integers (the job file's ``inference`` 1000, ``training`` 500, ``batch`` 100).
Gains and losses are not weighted by priority: priority decides who may be displaced, the
GPU-second balance whether displacing is worth it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from policies.gang import GangPlacement
from policies.placement import ClusterSnapshot, PlacementRequest, topology_aware
from policies.registry import Registry

Placer = Callable[[PlacementRequest, ClusterSnapshot], GangPlacement | None]


@dataclass(frozen=True, slots=True)
class RunningGang:
    job_id: str
    priority: int
    gpus: int
    seconds_since_checkpoint: float
    restart_overhead_s: float = 0.0

    def __post_init__(self) -> None:
        if self.gpus < 1:
            raise ValueError(f"gpus must be a positive integer, got {self.gpus!r}")
        if self.seconds_since_checkpoint < 0:
            raise ValueError(f"seconds_since_checkpoint must be >= 0, got {self.seconds_since_checkpoint!r}")
        if self.restart_overhead_s < 0:
            raise ValueError(f"restart_overhead_s must be >= 0, got {self.restart_overhead_s!r}")

    @property
    def work_lost_gpu_s(self) -> float:
        return self.gpus * (self.seconds_since_checkpoint + self.restart_overhead_s)


@dataclass(frozen=True, slots=True)
class PreemptionRequest:
    placement: PlacementRequest
    priority: int
    wait_avoided_s: float
    # a fair-share reclaim: the smallest gangs go first, the least work lost among those of one size
    reclaim: bool = False

    def __post_init__(self) -> None:
        if self.wait_avoided_s < 0:
            raise ValueError(f"wait_avoided_s must be >= 0, got {self.wait_avoided_s!r}")

    @property
    def gain_gpu_s(self) -> float:
        return self.placement.gpus * self.wait_avoided_s


@dataclass(frozen=True, slots=True)
class PreemptionPlan:
    victims: tuple[str, ...]  # job ids to checkpoint and requeue, in the order chosen
    placement: GangPlacement  # where the preemptor goes once they have left
    work_lost_gpu_s: float
    gain_gpu_s: float


def victim_order(request: PreemptionRequest, running: tuple[RunningGang, ...]) -> list[RunningGang]:
    """Candidates in the order they are considered: lower priority first, then (for a reclaim) the fewer
    GPUs, then least work lost."""
    return sorted(
        (r for r in running if r.priority < request.priority),
        key=lambda r: (r.priority, r.gpus if request.reclaim else 0, r.work_lost_gpu_s, r.job_id),
    )


class PreemptionPolicy(Protocol):
    """Which lower-priority gangs give up their GPUs for a waiting one; None: nobody."""

    def __call__(self, request: PreemptionRequest, cluster: ClusterSnapshot,
                 running: tuple[RunningGang, ...], /) -> PreemptionPlan | None: ...


PREEMPTION_POLICIES: Registry[PreemptionPolicy] = Registry("preemption")


@PREEMPTION_POLICIES.register("checkpoint_aware", default=True)
def plan_preemption(request: PreemptionRequest, cluster: ClusterSnapshot, running: tuple[RunningGang, ...],
                    placer: Placer = topology_aware) -> PreemptionPlan | None:
    """The victims to preempt so ``request`` fits, or None (it fits already, cannot fit, or is not worth it)."""
    if placer(request.placement, cluster) is not None:
        return None
    held = set(cluster.jobs())
    chosen: list[RunningGang] = []
    freed = cluster
    placement = None
    for victim in victim_order(request, running):
        if victim.job_id not in held:
            continue
        chosen.append(victim)
        freed = freed.without_job(victim.job_id)
        placement = placer(request.placement, freed)
        if placement is not None:
            break
    if placement is None:
        return None
    # Drop victims the placement does not need, most expensive first.
    for victim in sorted(chosen, key=lambda r: (-r.work_lost_gpu_s, r.job_id)):
        trial = [v for v in chosen if v is not victim]
        snapshot = cluster
        for v in trial:
            snapshot = snapshot.without_job(v.job_id)
        trial_placement = placer(request.placement, snapshot)
        if trial_placement is not None:
            chosen, placement = trial, trial_placement
    lost = sum(v.work_lost_gpu_s for v in chosen)
    gain = request.gain_gpu_s
    if lost > gain:
        return None
    return PreemptionPlan(tuple(v.job_id for v in chosen), placement, lost, gain)
