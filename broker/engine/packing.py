"""Clusters as pools of GPUs: placing gangs on free GPUs, and taking GPUs from lower-priority gangs.

A cluster hosts several gangs. Its snapshot says, per node and GPU, which job holds it: a job
running there (an open allocation) or a job on its way there (its claimed target GPUs). A job
waiting to run is placed on free GPUs of a cluster that is up (the placement policy), or takes
GPUs from lower-priority gangs (the preemption policy), which checkpoint and are requeued.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from datetime import datetime

from sqlalchemy import select
from sqlalchemy.orm import Session, object_session

from broker.engine import machine, shares
from broker.engine.checkpoints import current_allocation, progress_s
from broker.engine.notices import open_notice
from broker.engine.parts import AfterCommit, Parts, cluster_info
from broker.model import ACTIVE_STATES, CheckpointReason, ClusterState, JobState
from broker.spec.job import JobSpec
from broker.spec.model import place_allowed
from broker.store.tables import AllocationRow, ClusterRow, JobRow
from policies.gang import GangPlacement
from policies.placement import ClusterSnapshot, PlacementRequest
from policies.preemption import PreemptionRequest, RunningGang
from providers.topology import NodeTopology, UnknownInstanceType, generic_topology, topology


def node_topology(row: ClusterRow) -> NodeTopology:
    try:
        known = topology(row.instance_type)
    except UnknownInstanceType:
        return generic_topology(row.cloud, row.instance_type, row.gpus_per_node)
    return known if known.gpus == row.gpus_per_node else generic_topology(row.cloud, row.instance_type,
                                                                         row.gpus_per_node)


def claims(s: Session, cluster_id: str) -> dict[str, GangPlacement]:
    """Every GPU claim on a cluster: running allocations, then jobs heading there."""
    held: dict[str, GangPlacement] = {}
    for alloc in s.scalars(select(AllocationRow).where(AllocationRow.cluster_id == cluster_id,
                                                       AllocationRow.ended_at.is_(None))):
        held[alloc.job_id] = GangPlacement.from_json(cluster_id, alloc.gpus)
    for job in s.scalars(select(JobRow).where(JobRow.target_cluster_id == cluster_id, JobRow.state.in_(ACTIVE_STATES))):
        if job.target_gpus and job.id not in held:
            held[job.id] = GangPlacement.from_json(cluster_id, job.target_gpus)
    return held


def snapshot(s: Session, row: ClusterRow) -> ClusterSnapshot:
    snap = ClusterSnapshot.empty(row.id, node_topology(row), row.num_nodes)
    for job_id, placement in claims(s, row.id).items():
        unheld = _unheld(snap, placement)
        if unheld.gpus:
            snap = snap.with_placement(job_id, unheld)
    return snap


def _unheld(snap: ClusterSnapshot, placement: GangPlacement) -> GangPlacement:
    """``placement`` without the GPUs already held: a preemptor's claim names GPUs that the gangs
    it preempted still hold until they have checkpointed and left; they are not free either way."""
    def free(rank: int, gpu: int) -> bool:  # out-of-range GPUs stay, for with_placement to refuse
        node = snap.holders[rank] if 0 <= rank < len(snap.holders) else ()
        return not 0 <= gpu < len(node) or node[gpu] is None

    kept = tuple((rank, left) for rank, gpus in placement.gpus if (left := tuple(g for g in gpus if free(rank, g))))
    return GangPlacement(placement.cluster_id, kept)


def gang_request(job: JobRow, spec: JobSpec, gpus_per_node: int) -> PlacementRequest:
    topology = spec.broker.topology
    return PlacementRequest(job.id, gpus=job.num_nodes * gpus_per_node, num_nodes=job.num_nodes,
                            level=topology.level, required=topology.required)


def hosts(row: ClusterRow, spec: JobSpec, job: JobRow) -> int | None:
    """GPUs per node the job would take on this cluster's hardware, or None if it cannot run there."""
    if row.state != ClusterState.UP.value or row.num_nodes < job.num_nodes:
        return None
    if not place_allowed(spec.allowed_regions, row.cloud, row.region):
        return None
    if not spec.accelerators:
        return row.gpus_per_node if row.gpus_per_node == 0 else None
    for choice in spec.accelerators:
        accelerator = (row.accelerator or "").lower()
        if choice.name.lower() == accelerator and choice.count <= row.gpus_per_node and choice.on(row.instance_type):
            return choice.count
    return None


def running_gangs(s: Session, cluster_id: str, now: datetime, restart_overhead_s: float) -> tuple[RunningGang, ...]:
    """The gangs running on a cluster, with the work each would lose if stopped now."""
    gangs = []
    for alloc in s.scalars(select(AllocationRow).where(AllocationRow.cluster_id == cluster_id,
                                                       AllocationRow.ended_at.is_(None))):
        job = s.get(JobRow, alloc.job_id)
        if job is None or job.state != JobState.RUNNING.value:
            continue
        began = alloc.running_at or alloc.started_at
        kept = job.checkpoint_at if job.checkpoint_at and job.checkpoint_at > began else began
        gpus = sum(len(v) for v in alloc.gpus.values())
        gangs.append(RunningGang(job.id, job.priority, gpus, max((now - kept).total_seconds(), 0.0),
                                 restart_overhead_s))
    return tuple(gangs)


def claim_still_held(s: Session, job: JobRow, cluster_id: str, claim: GangPlacement) -> bool:
    """The claim's GPUs are still held by others beyond what they leave free (the gangs a
    preemptor takes them from have not left yet; shared GPUs have less than the job's share left)."""
    return not shares.claim_fits(shares.holdings(s, cluster_id), job.id, claim, job.gpu_share)


def first_claim(parts: Parts, row: ClusterRow, job: JobRow) -> GangPlacement:
    """The launching job's GPUs on its new cluster: all of them, the best-connected subset, or the
    share of one GPU a fraction asks for (then the job's ``gpu_share`` says how much)."""
    job.gpu_share = shares.share_on(row, parts.spec_of(job))
    if job.gpu_share is not None:
        s = object_session(row)
        assert s is not None, "the cluster row is added before its first claim"
        claim = shares.place_fraction(parts, s, row, job, job.gpu_share)
        assert claim is not None, "a fraction always fits an empty cluster launched for it"
        return claim
    per_node = job.gpus_per_node or row.gpus_per_node
    if per_node >= row.gpus_per_node:
        return GangPlacement.whole_nodes(row.id, row.num_nodes, row.gpus_per_node)
    empty = ClusterSnapshot.empty(row.id, node_topology(row), row.num_nodes)
    placement = parts.placement(gang_request(job, parts.spec_of(job), per_node), empty)
    assert placement is not None, "a gang always fits an empty cluster launched for it"
    return placement


def place_on_existing(parts: Parts, s: Session, job: JobRow) -> bool:
    """Claim free GPUs on a cluster that is already up, cheapest per GPU first."""
    spec = parts.spec_of(job)
    clusters = s.scalars(select(ClusterRow).where(ClusterRow.state == ClusterState.UP.value))
    for row in sorted(clusters, key=lambda r: (r.price_per_node_hour / max(r.gpus_per_node, 1), r.id)):
        per_node = hosts(row, spec, job)
        if per_node is None or open_notice(s, row.id, any_state=True) is not None:
            continue
        share = shares.share_on(row, spec)
        if share is not None:
            placement = shares.place_fraction(parts, s, row, job, share)
        else:
            placement = parts.placement(gang_request(job, spec, per_node), snapshot(s, row))
            if placement is not None and not shares.has_room(parts, s, row, job, placement):
                placement = None  # its GPUs are free, not the CPU or memory beside them
        if placement is None:
            continue
        job.target_cluster_id, job.target_gpus, job.gpu_share = row.id, placement.to_json(), share
        if job.started_at is None:
            job.started_at = parts.clock.now()
        machine.provisioning(s, parts.clock, job, cluster=row.id, zone=row.zone,
                             reason="placed on free GPUs of a running cluster")
        return True
    return False


def preempt_for(parts: Parts, s: Session, job: JobRow, after: AfterCommit) -> bool:
    """Take GPUs from lower-priority gangs when the work they lose is less than this job gains (True if so)."""
    spec = parts.spec_of(job)
    now = parts.clock.now()
    for row in s.scalars(select(ClusterRow).where(ClusterRow.state == ClusterState.UP.value)):
        per_node = hosts(row, spec, job)
        if per_node is None:
            continue
        running = running_gangs(s, row.id, now, parts.options.restart_overhead_s)
        request = PreemptionRequest(gang_request(job, spec, per_node), job.priority, _wait_avoided(s, running, now))
        plan = parts.preemption(request, snapshot(s, row), running)
        if plan is None:
            continue
        checkpoint_victims(parts, s, after, row, plan.victims, job.id, now, f"preempted by {job.id}")
        # What it takes from lower-priority gangs it takes whole, a fraction's job included.
        job.target_cluster_id, job.target_gpus, job.gpu_share = row.id, plan.placement.to_json(), None
        machine.provisioning(s, parts.clock, job, cluster=row.id, preempting=list(plan.victims),
                             work_lost_gpu_s=plan.work_lost_gpu_s, gain_gpu_s=plan.gain_gpu_s)
        return True
    return False


def checkpoint_victims(parts: Parts, s: Session, after: AfterCommit, row: ClusterRow, victims: Iterable[str],
                       by: str, now: datetime, event: str, why: Callable[[JobRow], str] | None = None) -> None:
    """Ask running gangs on ``row`` to checkpoint and give their GPUs to job ``by``: the one path of a
    preemption for a waiting job and of a fair-share reclaim. ``why`` writes the reason each shows."""
    for victim_id in victims:
        victim = s.get(JobRow, victim_id, with_for_update=True)
        assert victim is not None
        victim.preempted_by = by
        victim.checkpoint_requested_at = now
        if why is not None:
            victim.reason = why(victim)
        alloc = current_allocation(s, victim)
        if alloc is not None:
            alloc.stopping_at = now
        machine.checkpointing(s, parts.clock, victim, CheckpointReason.PREEMPTED, reason=event, cluster=row.id)
        signal = parts.spec_of(victim).broker.checkpoint.signal
        after.signals.append((cluster_info(row), victim.id, victim.attempt, signal))


def _wait_avoided(s: Session, running: tuple[RunningGang, ...], now: datetime) -> float:
    """How long the job would otherwise wait: until the first running gang is due to finish."""
    remaining = []
    for gang in running:
        other = s.get(JobRow, gang.job_id)
        if other is None or other.work_s is None:
            return math.inf
        remaining.append(max(other.work_s - progress_s(s, other, now), 0.0))
    return min(remaining) if remaining else 0.0
