"""GPUs shared by fractions: the share of each GPU every job on a cluster holds, and placing a fraction.

A job asking for a fraction of a GPU (``accelerators: A100:0.5``) holds one GPU of one node with
that share: ``JobRow.gpu_share`` while it heads to a cluster, ``AllocationRow.gpu_share`` once it
runs there. A whole-GPU gang holds its GPUs entirely (share None). Which node and GPU a fraction
gets is the sharing policy's choice (kind ``sharing``, ``fgd`` by default) on the cluster as it is
held now: GPU share, GPU memory (``broker.gpu_memory``) and the node's CPU and memory
(``resources.cpus``, ``resources.memory``) of every job there are counted.
"""

from __future__ import annotations

import zlib
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass

from sqlalchemy import select
from sqlalchemy.orm import Session

from broker.engine.parts import Parts
from broker.model import ACTIVE_STATES, JobState
from broker.spec.job import JobSpec
from broker.store.tables import AllocationRow, ClusterRow, JobRow
from policies.gang import GangPlacement
from policies.sharing import SharingCluster, SharingNode, SharingRequest, TaskShape, WorkloadMix
from providers.catalog import find_any

EPSILON = 1e-9
UNKNOWN_CPU_MILLI = 1 << 30  # a node type the catalog lacks: its CPU and memory limit nothing
UNKNOWN_MEMORY_MIB = 1 << 40


@dataclass(frozen=True, slots=True)
class Holding:
    """A job's claim on a cluster: its GPUs, and the share of each it holds (None: whole GPUs)."""

    job_id: str
    placement: GangPlacement
    share: float | None

    @property
    def per_gpu(self) -> float:
        return 1.0 if self.share is None else self.share


def share_on(row: ClusterRow, spec: JobSpec) -> float | None:
    """The share of one GPU ``spec`` asks for on this cluster's accelerator (None: whole GPUs)."""
    accelerator = (row.accelerator or "").lower()
    for choice in spec.accelerators:
        if choice.name.lower() == accelerator:
            return choice.fraction
    return None


def holdings(s: Session, cluster_id: str) -> list[Holding]:
    """Every claim on a cluster: running allocations, then jobs heading there, with their shares."""
    held: dict[str, Holding] = {}
    for alloc in s.scalars(select(AllocationRow).where(AllocationRow.cluster_id == cluster_id,
                                                       AllocationRow.ended_at.is_(None))):
        held[alloc.job_id] = Holding(alloc.job_id, GangPlacement.from_json(cluster_id, alloc.gpus), alloc.gpu_share)
    for job in s.scalars(select(JobRow).where(JobRow.target_cluster_id == cluster_id,
                                              JobRow.state.in_(ACTIVE_STATES))):
        if job.target_gpus and job.id not in held:
            held[job.id] = Holding(job.id, GangPlacement.from_json(cluster_id, job.target_gpus), job.gpu_share)
    return list(held.values())


def gpu_use(held: Iterable[Holding]) -> dict[tuple[int, int], float]:
    """(node rank, GPU) -> the share of it held, summed over the holders."""
    use: dict[tuple[int, int], float] = {}
    for h in held:
        for rank, gpus in h.placement.gpus:
            for g in gpus:
                use[(rank, g)] = use.get((rank, g), 0.0) + h.per_gpu
    return use


def claim_fits(held: Iterable[Holding], job_id: str, claim: GangPlacement, share: float | None) -> bool:
    """The claim's GPUs have ``share`` (a whole GPU for None) left once the other holders are counted."""
    use = gpu_use(h for h in held if h.job_id != job_id)
    need = 1.0 if share is None else share
    return all(use.get((rank, g), 0.0) + need <= 1.0 + EPSILON for rank, gpus in claim.gpus for g in gpus)


def task_shape(spec: JobSpec, share: float | None, gpus: int, accelerator: str | None) -> TaskShape:
    """What one node of the job asks of a node: CPU, memory, its GPUs and the share of each."""
    memory = spec.broker.gpu_memory if share is not None else None
    return TaskShape.of(cpus=spec.min_cpus or 0, memory_gb=spec.min_memory_gb or 0,
                        gpus=share if share is not None else gpus, gpu_memory_gb=memory or 0,
                        gpu_types=(accelerator,) if accelerator and gpus else ())


def memory_mb(row: ClusterRow, spec: JobSpec, share: float | None) -> int | None:
    """The GPU memory a fraction may pin: ``broker.gpu_memory`` if given, else its share of the GPU's."""
    if share is None:
        return None
    if spec.broker.gpu_memory:
        return round(spec.broker.gpu_memory * 1024)
    known = find_any(row.instance_type, row.cloud)
    return round(share * known.gpu_memory_gb * 1024) if known and known.gpu_memory_gb else None


def node_of(row: ClusterRow, rank: int) -> SharingNode:
    known = find_any(row.instance_type, row.cloud)
    return SharingNode(
        name=f"{row.id}/{rank}", gpus=row.gpus_per_node, gpu_model=row.accelerator or "",
        cpu_milli=known.vcpus * 1000 if known and known.vcpus else UNKNOWN_CPU_MILLI,
        memory_mib=round(known.memory_gb * 1024) if known and known.memory_gb else UNKNOWN_MEMORY_MIB,
        gpu_memory_mib=round(known.gpu_memory_gb * 1024) if known else 0, instance_type=row.instance_type,
    )


def sharing_cluster(parts: Parts, s: Session, row: ClusterRow, held: Iterable[Holding]) -> SharingCluster:
    """The cluster's nodes with what every holder takes of them, as the sharing policy sees it."""
    cluster = SharingCluster.of([node_of(row, rank) for rank in range(row.num_nodes)])
    for h in held:
        job = s.get(JobRow, h.job_id)
        spec = parts.spec_of(job) if job is not None else None
        for rank, gpus in h.placement.gpus:
            if not 0 <= rank < row.num_nodes:
                continue
            if spec is None:
                shape = TaskShape.of(gpus=h.share if h.share is not None else len(gpus))
            else:
                shape = task_shape(spec, h.share, len(gpus), row.accelerator)
            cluster = cluster.with_held(rank, shape, gpus)
    return cluster


def has_room(parts: Parts, s: Session, row: ClusterRow, job: JobRow, claim: GangPlacement) -> bool:
    """Every node of the claim has the CPU and memory the job asks per node, beside what others hold there."""
    spec = parts.spec_of(job)
    if not spec.min_cpus and not spec.min_memory_gb:
        return True
    cluster = sharing_cluster(parts, s, row, [h for h in holdings(s, row.id) if h.job_id != job.id])
    need = task_shape(spec, None, 0, None)
    return all(0 <= rank < row.num_nodes and int(cluster.cpu_left[rank]) >= need.cpu_milli
               and int(cluster.mem_left[rank]) >= need.memory_mib for rank in claim.nodes)


def _mix(parts: Parts, s: Session, row: ClusterRow, held: Iterable[Holding], task: TaskShape) -> WorkloadMix:
    """The shapes the cluster has seen: its holders', the queue's fractions, and this task's."""
    counts: Counter[TaskShape] = Counter([task])
    for h in held:
        job = s.get(JobRow, h.job_id)
        if job is not None:
            counts[task_shape(parts.spec_of(job), h.share, len(h.placement.gpus[0][1]) if h.placement.gpus else 0,
                              row.accelerator)] += 1
    for job in s.scalars(select(JobRow).where(JobRow.state == JobState.PENDING.value).limit(200)):
        share = share_on(row, parts.spec_of(job))
        if share is not None:
            counts[task_shape(parts.spec_of(job), share, 1, row.accelerator)] += 1
    return WorkloadMix.by_gpu_demand(dict(counts))


def place_fraction(parts: Parts, s: Session, row: ClusterRow, job: JobRow, share: float) -> GangPlacement | None:
    """One GPU with ``share`` left on each of the job's nodes (distinct nodes of ``row``, so all of one
    GPU type), as the sharing policy picks them one node after another; None unless all fit."""
    spec = parts.spec_of(job)
    held = [h for h in holdings(s, row.id) if h.job_id != job.id]
    cluster = sharing_cluster(parts, s, row, held)
    task = task_shape(spec, share, 1, row.accelerator)
    mix = _mix(parts, s, row, held, task)
    policy = parts.policies.sharing
    taken: dict[int, tuple[int, ...]] = {}
    for part in range(max(1, spec.num_nodes)):
        choice = policy(SharingRequest(task, mix, seed=zlib.crc32(f"{job.id}/{part}".encode()) if part
                                       else zlib.crc32(job.id.encode()), task_id=job.id,
                                       avoid_nodes=frozenset(taken)), cluster)
        if choice is None:
            return None
        taken[choice.node] = choice.gpus
        cluster = cluster.with_placement(task, choice)
    return GangPlacement(row.id, tuple(sorted(taken.items())))
