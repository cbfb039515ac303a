"""Eager allocation: readying the next queued job before a running job's predicted finish.

Once per step, after queued jobs have taken the GPUs that are free, every job still queued is
offered to the running jobs whose kept prediction (``broker.engine.forecast``) says they finish
soonest:

- **reserve**: if the queued job fits the GPUs a running job holds, and the eager policy says the
  finish is near, the queued job claims them (it is PROVISIONING, its target that cluster). It
  starts only once the running job's allocation has ended (``JobStepper.start_if_ready`` refuses
  GPUs someone else still holds), so a job that runs longer than predicted keeps its GPUs and the
  next job waits. If the reserving job is cancelled or fails, its claim is gone with it
  (``packing.claims`` counts active jobs only).
- **boot**: if it needs a new cluster and only the pool's size (``max_gpus``) holds it back, the
  clusters of the jobs finishing soonest (each the only holder of its cluster, and none that another
  queued job could run on: that one would take it with no boot at all) are counted as
  leaving until they make room; the policy weighs booting now (the cluster up at the last of those
  predicted finishes) against the worst-case overlap, and the cluster is launched counting them as
  leaving. A cluster is counted as leaving by one early boot only, and once its job has left it is
  torn down (``release_leaving``) rather than taken by another queued job. A cluster booted for a job that is
  then cancelled has no holder and is torn down by ``clusters.reap``.

A reservation never outlasts its use (``give_up``, every step before queued jobs are placed): once
the running job has slipped past the high end of the prediction it was made on, or its prediction
now says later than that, the policy is asked whether the queued job could run elsewhere sooner (a
new cluster's boot, if the pool has room counting the clusters nobody holds, which the pool lets go
while a job waits: ``broker.engine.autoscale``). If so the queued job is requeued and placed as it
would be without eager allocation; it does not reserve behind the same running job again. The
running job keeps its GPUs either way.

Each decision to act is a job event (``eager_reserve``, ``eager_boot``, ``eager_give_up``) with the
policy's reason.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from broker.engine import autoscale, clusters, machine, packing, reservations, setup_ahead
from broker.engine.checkpoints import current_allocation, end_allocation
from broker.engine.forecast import latest
from broker.engine.parts import AfterCommit, Parts
from broker.engine.planning import Planner
from broker.model import ACTIVE_STATES, ClusterState, JobState, TeardownReason
from broker.store.tables import AllocationRow, ClusterRow, JobEventRow, JobRow, PredictionRow
from policies.eager import EagerRequest
from policies.gang import GangPlacement
from policies.placement import ClusterSnapshot
from policies.selection import IDLE, Location

MAX_BOOTS_SEEN = 50  # recent cluster boots the boot time is the median of


@dataclass
class Finishing:
    """A running job with a kept prediction, on a cluster that is up."""

    job: JobRow
    cluster: ClusterRow
    prediction: PredictionRow

    def remaining(self, now: datetime) -> tuple[float, float, float]:
        p = self.prediction
        return tuple(max((at - now).total_seconds(), 0.0) for at in (p.finish_at, p.low_at, p.high_at))  # type: ignore[return-value]


def enabled(parts: Parts) -> bool:
    return parts.policies.eager_name != "off"


def ready_next(parts: Parts, planner: Planner) -> None:
    """Reserve GPUs, or boot a cluster early, for the queued jobs the policy says to ready now."""
    if not enabled(parts):
        return
    after = AfterCommit()
    now = parts.clock.now()
    with parts.store.transaction() as s:
        # A pipeline stage still waiting for the one before it is not queued yet (broker.engine.stages).
        queued = list(s.scalars(select(JobRow).where(JobRow.state == JobState.PENDING.value,
                                                     JobRow.after_job_id.is_(None))
                                .order_by(JobRow.priority.desc(), JobRow.created_at).with_for_update()))
        if not queued:
            return
        finishing = _finishing(s)
        leaving = _early_boots(s)
        for job in queued:
            if parts.options.admit is not None and not parts.options.admit(s, job):
                continue
            if not _reserve(parts, s, job, finishing, now, after):
                others = [q for q in queued if q.id != job.id and q.state == JobState.PENDING.value]
                _boot(parts, planner, s, job, finishing, leaving, _useful(parts, finishing, others), now, after)
    after.carry_out(parts.provisioner)


def _finishing(s: Session) -> list[Finishing]:
    found = []
    for job in s.scalars(select(JobRow).where(JobRow.state == JobState.RUNNING.value)):
        alloc = current_allocation(s, job)
        prediction = latest(s, job.id)
        if alloc is None or alloc.ended_at is not None or prediction is None or prediction.attempt != job.attempt:
            continue
        cluster = s.get(ClusterRow, alloc.cluster_id)
        if cluster is not None and cluster.state == ClusterState.UP.value:
            found.append(Finishing(job, cluster, prediction))
    return sorted(found, key=lambda f: (f.prediction.finish_at, f.job.id))


def _reserve(parts: Parts, s: Session, job: JobRow, finishing: list[Finishing], now: datetime,
             after: AfterCommit) -> bool:
    spec = parts.spec_of(job)
    gave_up = reservations.given_up(s, job.id)
    for item in finishing:
        if (item.job.id, item.job.attempt) in gave_up:
            continue
        per_node = packing.hosts(item.cluster, spec, job)
        if per_node is None:
            continue
        placement = _fits_after(parts, s, item, job, per_node)
        if placement is None:
            continue
        remaining, low, high = item.remaining(now)
        decision = parts.eager(EagerRequest("reserve", remaining, low, high, parts.options.eager_lead_s))
        if not decision.act:
            continue
        job.target_cluster_id, job.target_gpus = item.cluster.id, placement.to_json()
        if job.started_at is None:
            job.started_at = now
        machine.provisioning(s, parts.clock, job, cluster=item.cluster.id, zone=item.cluster.zone,
                             reason=f"reserved the GPUs of {item.job.id}, predicted to finish soon")
        parts.event(s, job.id, "eager_reserve", cluster=item.cluster.id, after_job=item.job.id,
                    after_attempt=item.job.attempt, attempt=job.attempt, predicted_finish=item.prediction.finish_at,
                    predicted_high=item.prediction.high_at, reason=decision.reason)
        setup_ahead.begin(parts, s, job, item.cluster, placement, after)
        return True
    return False


def _fits_after(parts: Parts, s: Session, item: Finishing, job: JobRow, per_node: int) -> GangPlacement | None:
    """Where ``job`` would go on the cluster once ``item.job`` has left (other claims stay)."""
    snap = ClusterSnapshot.empty(item.cluster.id, packing.node_topology(item.cluster), item.cluster.num_nodes)
    try:
        for holder, placement in packing.claims(s, item.cluster.id).items():
            if holder != item.job.id:
                snap = snap.with_placement(holder, placement)
    except ValueError:
        return None  # claims overlap (a preemption under way): not a cluster to reserve on now
    return parts.placement(packing.gang_request(job, parts.spec_of(job), per_node), snap)


def _useful(parts: Parts, finishing: list[Finishing], others: list[JobRow]) -> set[str]:
    """Clusters of finishing jobs another queued job could run on: those are worth more kept than
    torn down for an early boot (the next job would take them with no boot at all)."""
    return {item.cluster.id for item in finishing
            if any(packing.hosts(item.cluster, parts.spec_of(q), q) is not None for q in others)}


def _early_boots(s: Session) -> set[str]:
    """Clusters an active job's early boot already counted as leaving."""
    active = select(JobRow.id).where(JobRow.state.in_(ACTIVE_STATES))
    rows = s.scalars(select(JobEventRow).where(JobEventRow.kind == "eager_boot", JobEventRow.job_id.in_(active)))
    return {str(c) for row in rows for c in (row.detail.get("leaving") or [])}


def _boot(parts: Parts, planner: Planner, s: Session, job: JobRow, finishing: list[Finishing], leaving: set[str],
          useful: set[str], now: datetime, after: AfterCommit) -> None:
    """Boot the job's cluster early if the clusters of the jobs finishing soonest make room for it."""
    max_gpus = parts.options.max_gpus
    if max_gpus is None:
        return  # nothing but the pool's size keeps a queued job from booting its own cluster
    exclude = planner.avoid(s, job)
    plan = planner.plan(s, job, Location(IDLE), exclude)
    offer = next((loc.offer for loc in plan.locations if loc.offer is not None and loc.kind != IDLE), None)
    if offer is None:
        return
    gpus = job.num_nodes * offer.gpus_per_node
    # Soonest first, the clusters whose only holder is a finishing job, until their GPUs make room.
    freeing: list[Finishing] = []
    for item in finishing:
        if item.cluster.id in leaving | useful or set(packing.claims(s, item.cluster.id)) != {item.job.id}:
            continue
        freeing.append(item)
        if clusters.fleet_gpus(s, [f.cluster.id for f in freeing]) + gpus <= max_gpus:
            break
    else:
        return  # even with all of them gone the pool has no room
    last = freeing[-1]  # the room is there once the last of them has finished
    remaining, low, high = last.remaining(now)
    price = (offer.spot_price or offer.on_demand_price) * job.num_nodes
    decision = parts.eager(EagerRequest("boot", remaining, low, high, parts.options.eager_lead_s,
                                        boot_seconds(s, parts), price))
    if not decision.act:
        return
    going = [f.cluster.id for f in freeing]
    row = clusters.launch(parts, s, job, plan, exclude, after, leaving=going)
    if row is None:
        return
    leaving.update(going)
    if job.started_at is None:
        job.started_at = now
    machine.provisioning(s, parts.clock, job, cluster=row.id, zone=row.zone,
                         reason=f"booted early, to be up when {', '.join(f.job.id for f in freeing)} finish")
    parts.event(s, job.id, "eager_boot", cluster=row.id, leaving=going, after_jobs=[f.job.id for f in freeing],
                predicted_finish=last.prediction.finish_at, early_cost=round(decision.early_cost, 6),
                idle_removed_s=round(decision.idle_removed_s, 1), reason=decision.reason)


def give_up(parts: Parts, planner: Planner) -> None:
    """Requeue the jobs whose reservation the policy says to give up: its holder runs late, and they
    could run elsewhere sooner."""
    if not enabled(parts):
        return
    now = parts.clock.now()
    with parts.store.transaction() as s:
        for job, detail in reservations.held(s):
            holder = s.get(JobRow, str(detail.get("after_job")))
            promised = _at(detail.get("predicted_high") or detail.get("predicted_finish"))
            if holder is None or holder.state != JobState.RUNNING.value or promised is None:
                continue  # gone: the reserving job starts (or is placed anew) the ordinary way
            prediction = latest(s, holder.id)
            finish = prediction.finish_at if prediction is not None else promised
            high = prediction.high_at if prediction is not None else promised
            overrun = max((now - promised).total_seconds(), 0.0)
            slip = max((finish - promised).total_seconds(), 0.0)
            if overrun <= 0 and slip <= 0:
                continue  # on time: nothing to weigh
            remaining = max((finish - now).total_seconds(), 0.0)
            decision = parts.eager(EagerRequest(
                "release", remaining, remaining, max((high - now).total_seconds(), 0.0), parts.options.eager_lead_s,
                overrun_s=overrun, slip_s=slip, elsewhere_s=_elsewhere_s(parts, planner, s, job)))
            if not decision.act:
                continue
            parts.event(s, job.id, "eager_give_up", cluster=job.target_cluster_id, after_job=holder.id,
                        after_attempt=holder.attempt, overrun_s=round(overrun, 1), slip_s=round(slip, 1),
                        reason=decision.reason)
            job.target_cluster_id = job.target_gpus = None
            machine.requeued(s, parts.clock, job, reason=f"gave up the GPUs of {holder.id}, running late")


def _at(value: Any) -> datetime | None:
    if isinstance(value, datetime):
        return value
    try:
        return datetime.fromisoformat(str(value)) if value else None
    except ValueError:
        return None


def _elsewhere_s(parts: Parts, planner: Planner, s: Session, job: JobRow) -> float | None:
    """Market seconds until ``job`` could run on a cluster of its own (a boot), or None if the pool (or
    its queue's share) has no room even with the clusters nobody holds gone."""
    exclude = planner.avoid(s, job)
    plan = planner.plan(s, job, Location(IDLE), exclude)
    offer = next((loc.offer for loc in plan.locations if loc.offer is not None and loc.kind != IDLE), None)
    if offer is None:
        return None
    gpus = job.num_nodes * offer.gpus_per_node
    unheld = [row.id for row in s.scalars(select(ClusterRow).where(ClusterRow.state.in_(clusters.HOLDING)))
              if not packing.claims(s, row.id)]
    if parts.options.max_gpus is not None and clusters.fleet_gpus(s, unheld) + gpus > parts.options.max_gpus:
        return None
    if autoscale.queue_full(parts, s, job, gpus, unheld) is not None:
        return None
    return boot_seconds(s, parts)


def release_leaving(parts: Parts) -> None:
    """Tear down the clusters an early boot counted as leaving once their job has left them.

    Runs before queued jobs are placed: the room an early boot took under ``max_gpus`` was these
    clusters', and another queued job taking one of them would hold the pool above its size.
    """
    if parts.options.max_gpus is None or not enabled(parts):
        return
    now = parts.clock.now()
    with parts.store.transaction() as s:
        for cluster_id in sorted(_early_boots(s)):
            row = s.get(ClusterRow, cluster_id, with_for_update=True)
            if row is None or row.state not in clusters.HOLDING:
                continue
            for alloc in s.scalars(select(AllocationRow).where(AllocationRow.cluster_id == row.id,
                                                               AllocationRow.ended_at.is_(None))):
                holder = s.get(JobRow, alloc.job_id)
                if holder is not None and JobState(holder.state).terminal:  # cancelled: its allocation ends now
                    end_allocation(alloc, holder.state.lower(), now)
            if not packing.claims(s, row.id):
                clusters.release(row, now, TeardownReason.IDLE)


def boot_seconds(s: Session, parts: Parts) -> float:
    """How long clusters have taken to come up (median of recent boots); the restart overhead if none yet."""
    rows = s.execute(select(ClusterRow.created_at, ClusterRow.up_at).where(
        ClusterRow.up_at.is_not(None), ClusterRow.teardown_reason.is_distinct_from("launch_failed"))
        .order_by(ClusterRow.created_at.desc()).limit(MAX_BOOTS_SEEN)).all()
    seen = [(up - created).total_seconds() for created, up in rows if up is not None and up >= created]
    return statistics.median(seen) if seen else parts.options.restart_overhead_s
