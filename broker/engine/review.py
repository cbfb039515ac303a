"""The once-a-tick review of a running job: should it move, and is the place it moves to ready?

A move brings the new cluster up first while the job keeps running where it is; only once the
new nodes are up is the job told to checkpoint, so it loses almost no work. The review asks the
selection policy once per market tick, as the simulator does.
"""

from __future__ import annotations

from datetime import datetime

from sqlalchemy.orm import Session

from broker.engine import clusters, machine
from broker.engine.parts import AfterCommit, Parts, Place, cluster_info
from broker.engine.planning import Planner, Reads, same_place
from broker.model import CheckpointReason, ClusterState
from broker.store.tables import AllocationRow, ClusterRow, JobRow
from policies.selection import Plan


class Reviewer:
    def __init__(self, parts: Parts, planner: Planner) -> None:
        self.parts = parts
        self.planner = planner
        self._asked: dict[str, int] = {}  # job id -> the market tick its running location was last reviewed

    def reviewed(self, job_id: str, now: datetime) -> bool:
        """The job's place was reviewed in the market tick of ``now`` already."""
        return self._asked.get(job_id) == self.tick(now)

    def tick(self, now: datetime) -> int:
        return int(now.timestamp() // self.planner.review_seconds())

    def stays(self, s: Session, job: JobRow, cluster: Place, reads: Reads) -> bool:
        """Review the place of a running job that owns its cluster and is heading nowhere, with what the
        pass read for all such jobs at once: True, and the job counts as reviewed this tick, when the
        policy keeps it where it is (as ``review`` would find); False leaves the review to ``review``."""
        now = self.parts.clock.now()
        here = self.planner.location_of(cluster)
        plan = self.planner.plan(s, job, here, set(), reads)
        if plan.locations and not same_place(plan.locations[0], here):
            return False
        self._asked[job.id] = self.tick(now)
        return True

    def review(self, s: Session, job: JobRow, alloc: AllocationRow, cluster: ClusterRow, after: AfterCommit) -> None:
        parts = self.parts
        target = clusters.target_of(s, job)
        if target is not None:
            if target.state == ClusterState.UP.value:
                job.checkpoint_requested_at = alloc.stopping_at = parts.clock.now()
                machine.checkpointing(s, parts.clock, job, CheckpointReason.MOVE, cluster=cluster.id,
                                      to=target.zone, reason="moving: the new nodes are up")
                signal = parts.spec_of(job).broker.checkpoint.signal
                after.signals.append((cluster_info(cluster), job.id, job.attempt, signal))
            return
        job.target_cluster_id = job.target_gpus = None  # a move whose launch failed: stay
        tick = self.tick(parts.clock.now())
        if self._asked.get(job.id) == tick or cluster.job_id != job.id:
            return  # reviewed this tick already; a gang placed on a shared cluster stays put
        self._asked[job.id] = tick
        here = self.planner.location_of(cluster)
        plan = self.planner.plan(s, job, here, set())
        if not plan.locations or same_place(plan.locations[0], here):
            return
        destination = plan.locations[0]
        if clusters.launch(parts, s, job, Plan((destination,), plan.reason), set(), after,
                           leaving=cluster.id) is not None:
            parts.event(s, job.id, "moving", to=destination.label, reason=plan.reason)
