"""Clusters as pools of GPUs: snapshots for the placement and preemption policies.

A cluster hosts several gangs. Its snapshot says, per node and GPU, which job holds it: a job
running there (an open allocation) or a job on its way there (its claimed target GPUs).
"""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import select
from sqlalchemy.orm import Session

from broker.model import ClusterState, GangPlacement, JobState
from broker.spec import JobSpec
from broker.store.tables import AllocationRow, ClusterRow, JobRow
from policies.placement import ClusterSnapshot, PlacementRequest

__all__ = ["ClusterSnapshot", "RunningGang", "gang_request", "holdings", "hosts", "node_topology",
           "running_gangs", "snapshot"]
from policies.preemption import RunningGang
from providers.topology import NodeTopology, UnknownInstanceType, generic_topology, topology

ACTIVE = [s.value for s in JobState if not s.terminal]


def node_topology(row: ClusterRow) -> NodeTopology:
    try:
        known = topology(row.instance_type)
    except UnknownInstanceType:
        return generic_topology(row.cloud, row.instance_type, row.gpus_per_node)
    return known if known.gpus == row.gpus_per_node else generic_topology(row.cloud, row.instance_type,
                                                                         row.gpus_per_node)


def holdings(s: Session, cluster_id: str) -> dict[str, GangPlacement]:
    """Every GPU claim on a cluster: running allocations, then jobs heading there."""
    held: dict[str, GangPlacement] = {}
    for alloc in s.scalars(select(AllocationRow).where(AllocationRow.cluster_id == cluster_id,
                                                       AllocationRow.ended_at.is_(None))):
        held[alloc.job_id] = GangPlacement.from_json(cluster_id, alloc.gpus)
    for job in s.scalars(select(JobRow).where(JobRow.target_cluster_id == cluster_id, JobRow.state.in_(ACTIVE))):
        if job.target_gpus and job.id not in held:
            held[job.id] = GangPlacement.from_json(cluster_id, job.target_gpus)
    return held


def snapshot(s: Session, row: ClusterRow) -> ClusterSnapshot:
    snap = ClusterSnapshot.empty(row.id, node_topology(row), row.num_nodes)
    for job_id, placement in holdings(s, row.id).items():
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
    if spec.broker.clouds and row.cloud not in {c.cloud for c in spec.broker.clouds}:
        return None
    if not spec.accelerators:
        return row.gpus_per_node if row.gpus_per_node == 0 else None
    for choice in spec.accelerators:
        accelerator = (row.accelerator or "").lower()
        if choice.name.lower() == accelerator and choice.count <= row.gpus_per_node:
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
