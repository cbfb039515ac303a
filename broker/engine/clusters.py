"""Cluster lifecycle: launch, sync with the backend, relaunch after a crash, release, reap.

This module is the only writer of ``ClusterRow.state``, and every change goes through
``CLUSTER_TRANSITIONS``. A cluster row is written (PROVISIONING) before its launch is asked
for, so an engine that crashed in between launches it again on its next sync; launches are
idempotent in the provisioner.

PROVISIONING -> UP -> TERMINATING -> TERMINATED, or PROVISIONING -> FAILED (it never came up)
"""

from __future__ import annotations

import logging
from collections.abc import Collection
from datetime import datetime

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from broker.backends.base import ClusterInfo, ClusterPhase, ClusterStatus
from broker.engine import autoscale, packing
from broker.engine.checkpoints import end_allocation
from broker.engine.notices import record_backend_notice
from broker.engine.parts import AfterCommit, Parts, cluster_info, jsonable
from broker.errors import BrokerError
from broker.model import ACTIVE_STATES, LIVE_CLUSTER_STATES, ClusterState, JobState, TeardownReason
from broker.store.tables import AllocationRow, ClusterRow, JobEventRow, JobRow
from broker.tokens import token_digest
from policies.selection import IDLE, ON_DEMAND, Plan

log = logging.getLogger("broker.engine")

CLUSTER_TRANSITIONS: dict[ClusterState, frozenset[ClusterState]] = {
    ClusterState.PROVISIONING: frozenset({ClusterState.UP, ClusterState.FAILED, ClusterState.TERMINATING,
                                          ClusterState.TERMINATED}),
    ClusterState.UP: frozenset({ClusterState.TERMINATING, ClusterState.TERMINATED, ClusterState.FAILED}),
    ClusterState.TERMINATING: frozenset({ClusterState.TERMINATED, ClusterState.FAILED}),
    ClusterState.TERMINATED: frozenset(),
    ClusterState.FAILED: frozenset(),
}
HOLDING = [ClusterState.PROVISIONING.value, ClusterState.UP.value]  # clusters whose GPUs count


class IllegalClusterTransition(BrokerError, RuntimeError):
    pass


def _move(row: ClusterRow, target: ClusterState) -> None:
    current = ClusterState(row.state)
    if target not in CLUSTER_TRANSITIONS[current]:
        raise IllegalClusterTransition(f"cluster {row.id} cannot move from {current} to {target}")
    row.state = target.value


def sync(parts: Parts) -> None:
    """Bring every live cluster row in line with what the backend says of it."""
    with parts.store.transaction() as s:  # columns, not rows: thousands of clusters, most with nothing to write
        rows = s.execute(select(ClusterRow.id, ClusterRow.state, ClusterRow.handle, ClusterRow.cloud,
                                ClusterRow.region, ClusterRow.zone, ClusterRow.instance_type, ClusterRow.num_nodes,
                                ClusterRow.gpus_per_node, ClusterRow.spot)
                         .where(ClusterRow.state.in_(LIVE_CLUSTER_STATES))).all()
    infos = [ClusterInfo(row.id, row.cloud, row.region, row.zone, row.instance_type, row.num_nodes,
                         row.gpus_per_node, row.spot, parts.tokens(row.id), dict(row.handle or {})) for row in rows]
    statuses = parts.provisioner.statuses(infos) if infos else {}  # one call for the whole fleet
    for row, info in zip(rows, infos, strict=True):
        status = statuses[row.id]
        now = parts.clock.now()
        if status.phase is ClusterPhase.UNKNOWN and row.state == ClusterState.PROVISIONING:
            parts.provisioner.launch(info)  # written to the store but never launched: a crash
            continue
        if status.notice_action_at is not None:
            record_backend_notice(parts.store, parts.clock, row.id, status.notice_action_at)
        if _unchanged(row.state, row.handle, status):
            continue
        with parts.store.transaction() as s:
            current = s.get(ClusterRow, row.id)
            if current is None or current.state != row.state:
                continue
            if status.handle:
                current.handle = {**(current.handle or {}), **status.handle}
            if status.phase is ClusterPhase.UP and current.state == ClusterState.PROVISIONING:
                _move(current, ClusterState.UP)
                current.up_at = status.up_at or now
            elif status.phase is ClusterPhase.FAILED:
                _move(current, ClusterState.FAILED)
                current.teardown_reason = TeardownReason.LAUNCH_FAILED.value
                current.reason = status.reason
                current.terminated_at = now
                parts.event(s, current.job_id, "launch_failed", cluster=current.id, zone=current.zone,
                            reason=status.reason, capacity=status.capacity_error)
            elif status.phase in (ClusterPhase.TERMINATED, ClusterPhase.UNKNOWN):
                _move(current, ClusterState.TERMINATED)
                current.teardown_reason = current.teardown_reason or TeardownReason.CLOUD.value
                current.reason = current.reason or status.reason
                current.terminated_at = min(status.ended_at or now, now)
                if current.up_at is None:
                    current.up_at = current.terminated_at


def _unchanged(state: str, handle: dict[str, object] | None, status: ClusterStatus) -> bool:
    """The backend says of the cluster what its row (``state``, ``handle``) already holds: sync has nothing
    to write."""
    same_state = (status.phase is ClusterPhase.PROVISIONING
                  or (status.phase is ClusterPhase.UP and state != ClusterState.PROVISIONING))
    handle = handle or {}
    return same_state and all(handle.get(key) == value for key, value in status.handle.items())


def fleet_gpus(s: Session, leaving: str | Collection[str] | None = None) -> int:
    """GPUs of every cluster up or coming up (not counting ``leaving``: what a migration, or the jobs
    an early boot follows, release)."""
    query = select(func.coalesce(func.sum(ClusterRow.num_nodes * ClusterRow.gpus_per_node), 0)).where(
        ClusterRow.state.in_(HOLDING))
    if isinstance(leaving, str):
        query = query.where(ClusterRow.id != leaving)
    elif leaving:
        query = query.where(ClusterRow.id.not_in(list(leaving)))
    return int(s.scalar(query) or 0)


BLOCKED = ("fleet_full", "queue_full")
# What ends a spell of waiting on a limit: the job launched, or moved (placed, requeued, ended).
UNBLOCKED = ("launch", "transition")


def record_blocked(parts: Parts, s: Session, job: JobRow, kind: str, **detail: object) -> None:
    """Record that a limit holds the job back, once per spell: not on every step it still waits for
    the same reason, only when it was last launched or moved, or held back by something else."""
    last = s.execute(select(JobEventRow.kind, JobEventRow.detail)
                     .where(JobEventRow.job_id == job.id, JobEventRow.kind.in_((*BLOCKED, *UNBLOCKED)))
                     .order_by(JobEventRow.id.desc()).limit(1)).first()
    if last is not None and last.kind == kind and last.detail == jsonable(detail):
        return
    parts.event(s, job.id, kind, **detail)


def launch(parts: Parts, s: Session, job: JobRow, plan: Plan, exclude: set[str], after: AfterCommit,
           leaving: str | Collection[str] | None = None) -> ClusterRow | None:
    """Write the cluster row for the plan's first usable location; it is launched after commit."""
    for location in plan.locations:
        if location.offer is None or location.kind == IDLE:
            continue
        offer = location.offer
        spot = location.kind != ON_DEMAND
        if spot and offer.location in exclude:
            continue
        gpus = job.num_nodes * offer.gpus_per_node
        max_gpus = parts.options.max_gpus
        if max_gpus is not None and fleet_gpus(s, leaving) + gpus > max_gpus:
            record_blocked(parts, s, job, "fleet_full", max_gpus=max_gpus)
            return None
        if (limit := autoscale.queue_full(parts, s, job, gpus, leaving)) is not None:
            record_blocked(parts, s, job, "queue_full", queue_max_gpus=limit)
            return None
        sequence = int(s.scalar(select(func.count()).select_from(ClusterRow)
                                .where(ClusterRow.job_id == job.id)) or 0) + 1
        cluster_id = f"{job.id}-c{sequence}"
        row = ClusterRow(
            id=cluster_id, launch_key=f"{job.id}:{sequence}", job_id=job.id,
            backend=parts.provisioner.name, cloud=offer.cloud, region=offer.region, zone=offer.zone,
            instance_type=offer.instance_type, accelerator=offer.accelerator,
            gpus_per_node=offer.gpus_per_node, num_nodes=job.num_nodes, spot=spot,
            price_per_node_hour=offer.spot_price if spot else offer.on_demand_price,
            on_demand_price_per_node_hour=offer.on_demand_price, state=ClusterState.PROVISIONING.value,
            token_hash=token_digest(parts.tokens(cluster_id)), handle={}, created_at=parts.clock.now(),
        )
        s.add(row)
        job.target_cluster_id = row.id
        job.target_gpus = packing.first_claim(parts, row, job).to_json()
        parts.event(s, job.id, "launch", cluster=row.id, zone=offer.zone, cloud=offer.cloud,
                    spot=spot, price=row.price_per_node_hour, reason=plan.reason)
        after.launches.append(cluster_info(row, parts.tokens(row.id)))
        return row
    return None


def target_of(s: Session, job: JobRow) -> ClusterRow | None:
    """The cluster the job is heading to, while it is up or coming up."""
    if job.target_cluster_id is None:
        return None
    row = s.get(ClusterRow, job.target_cluster_id)
    if row is None or row.state not in HOLDING:
        return None
    return row


def release(row: ClusterRow, now: datetime, why: TeardownReason) -> None:
    """Tear a cluster down: it is TERMINATING from now, and terminated after commit."""
    if row.state != ClusterState.TERMINATING.value:
        _move(row, ClusterState.TERMINATING)
        row.terminate_at = now
        row.teardown_reason = why.value


def reap(parts: Parts) -> None:
    """Tear down every live cluster that no active job holds or is heading to (unless the pool keeps it)."""
    after = AfterCommit()
    now = parts.clock.now()
    with parts.store.transaction() as s:
        # Only what may change is read (a step with thousands of held clusters reads none of them): the
        # open allocations on live clusters whose holder has ended or is gone, which end here, and the
        # live clusters no open allocation of an active job holds, which go unless a job is heading to
        # one with GPUs claimed (``packing.claims``) or the pool keeps it.
        state: str | None
        for alloc, state in s.execute(select(AllocationRow, JobRow.state.label("holder"))
                                      .outerjoin(JobRow, JobRow.id == AllocationRow.job_id)
                                      .join(ClusterRow, ClusterRow.id == AllocationRow.cluster_id)
                                      .where(AllocationRow.ended_at.is_(None), ClusterRow.state.in_(HOLDING),
                                             JobRow.state.is_(None) | JobRow.state.not_in(ACTIVE_STATES))
                                      .order_by(AllocationRow.id)):
            end_allocation(alloc, state.lower() if state else "orphaned", now)
        held = (select(AllocationRow.id).join(JobRow, JobRow.id == AllocationRow.job_id)
                .where(AllocationRow.cluster_id == ClusterRow.id, AllocationRow.ended_at.is_(None),
                       JobRow.state.in_(ACTIVE_STATES)).exists())
        unheld = list(s.scalars(select(ClusterRow).where(ClusterRow.state.in_(HOLDING), ~held)
                                .order_by(ClusterRow.id)))
        headed = {cid for cid, gpus in s.execute(
            select(JobRow.target_cluster_id, JobRow.target_gpus)
            .join(ClusterRow, ClusterRow.id == JobRow.target_cluster_id)
            .where(JobRow.state.in_(ACTIVE_STATES), ClusterRow.state.in_(HOLDING))) if gpus} if unheld else set()
        for row in unheld:
            if row.id not in headed and not autoscale.keep(parts, s, row, now):
                release(row, now, TeardownReason.IDLE)
        for row in s.scalars(select(ClusterRow).where(ClusterRow.state == ClusterState.TERMINATING.value)):
            after.terminations.append(cluster_info(row))
            for alloc in _open_allocations(s, row.id):
                holder = s.get(JobRow, alloc.job_id)
                if holder is not None and holder.state == JobState.RUNNING.value:
                    after.stops.append((cluster_info(row), holder.id, holder.attempt))
    after.carry_out(parts.provisioner)


def _open_allocations(s: Session, cluster_id: str) -> list[AllocationRow]:
    return list(s.scalars(select(AllocationRow).where(AllocationRow.cluster_id == cluster_id,
                                                      AllocationRow.ended_at.is_(None))))
