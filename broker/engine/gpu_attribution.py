"""The ledger's running minutes split by what their GPUs did: busy stays ``running``, idle is ``held_idle``.

Metering writes a running job's GPU-minutes as ``running`` from the allocation alone. Once the
job's agent has reported what those GPUs did in that minute (``gpu_minutes``) and the minute is
metered, this pass splits the job's row: the share of its GPU time measured below ``idle_below``
(each GPU's share of samples below it, as its agent counted them) moves to a row of its own (holder
``held_idle:<job>``), priced by the same share, so every piece still adds up to the cluster's GPUs
and price. Why they were idle is its usage:

- ``held_idle_startup``: before the attempt's first progress report (imports, data loading,
  restoring a checkpoint). A job that has not reported progress yet is ``stalled`` until its first
  report arrives, when its earlier idle minutes become ``startup``;
- ``held_idle_checkpoint``: between the broker asking for a checkpoint and the report of one
  (at most ``CHECKPOINT_WINDOW`` after the ask);
- ``held_idle_stalled``: everything else (input pipeline, evaluation on CPU, a hung job).

On a GPU the job shares, its own processes' utilisation is used where the driver gave it, else
the whole GPU's (a GPU idle as a whole is idle for each of its jobs). GPUs with no figure (not
reported, or the GPU does not give utilisation) stay ``running``: unmeasured, not idle.
"""

from __future__ import annotations

from collections import defaultdict
from datetime import datetime, timedelta

from sqlalchemy import func, select, update
from sqlalchemy.orm import Session

from broker.engine.cadence import ASKED
from broker.model import ClusterState, Usage
from broker.store import Store
from broker.store.gpu import GpuMinuteRow
from broker.store.tables import AllocationRow, CheckpointReportRow, ClusterRow, JobEventRow, LedgerRow, ProgressRow

CHECKPOINT_WINDOW = timedelta(minutes=30)
BATCH = 2000  # GPU-minutes attributed per pass; the rest on the next
HELD_IDLE = (Usage.HELD_IDLE_STARTUP.value, Usage.HELD_IDLE_CHECKPOINT.value, Usage.HELD_IDLE_STALLED.value)


def idle_holder(job_id: str) -> str:
    return f"held_idle:{job_id}"


def attribute(store: Store, idle_below: float, now: datetime) -> int:
    """Split the metered running minutes that reported GPU minutes cover; returns the GPU-minutes used."""
    with store.transaction() as s:
        return attribute_in(s, idle_below, now)


def attribute_in(s: Session, idle_below: float, now: datetime) -> int:
    rows = list(s.scalars(select(GpuMinuteRow).where(GpuMinuteRow.attributed_at.is_(None))
                          .order_by(GpuMinuteRow.started_at).limit(BATCH)))
    groups: dict[tuple[str, int, datetime, datetime], list[GpuMinuteRow]] = defaultdict(list)
    for row in rows:
        groups[(row.job_id, row.attempt, row.started_at, row.ended_at)].append(row)
    done = 0
    for (job_id, attempt, start, end), minutes in groups.items():
        alloc = s.scalar(select(AllocationRow).where(AllocationRow.job_id == job_id, AllocationRow.attempt == attempt))
        cluster = s.get(ClusterRow, alloc.cluster_id) if alloc is not None else None
        if alloc is None or cluster is None:
            for m in minutes:
                m.attributed_at = now  # nothing to split: no such run (kept as measured)
            continue
        metered = cluster.metered_until
        if metered is None or metered < min(end, cluster.terminated_at or end):
            continue  # the ledger has not reached this minute yet
        _split(s, job_id, alloc, minutes, start, end, idle_below)
        for m in minutes:
            m.attributed_at = now
        done += len(minutes)
    return done


def idle_share(alloc: AllocationRow, minutes: list[GpuMinuteRow], idle_below: float) -> float:
    """The share of the allocation's GPU time measured idle in these minutes (0 to 1).

    A GPU-minute whose agent counted its idle samples is idle for that share of its samples (busy
    for half a minute, idle for the other half: half idle); one without the count (an older agent)
    is idle whole when its mean is below ``idle_below``, else busy.
    """
    held = {(str(rank), int(gpu)) for rank, gpus in (alloc.gpus or {}).items() for gpu in gpus}
    if not held:
        return 0.0
    idle: dict[tuple[str, int], float] = {}
    for m in minutes:
        key = (m.node, m.gpu)
        if key in held:
            idle[key] = max(idle.get(key, 0.0), _idle_fraction(m, idle_below))
    return sum(idle.values()) / len(held)


def _idle_fraction(m: GpuMinuteRow, idle_below: float) -> float:
    if m.idle_samples is not None and m.samples > 0:
        return min(m.idle_samples / m.samples, 1.0)
    util = m.job_utilization_mean if m.job_utilization_mean is not None else m.utilization_mean
    return 1.0 if util is not None and util < idle_below * 100.0 else 0.0


def _split(s: Session, job_id: str, alloc: AllocationRow, minutes: list[GpuMinuteRow], start: datetime,
           end: datetime, idle_below: float) -> None:
    """Split the job's metered minutes in ``start``..``end`` by every GPU minute reported for them so far.

    Nodes report separately, so a minute may be split again when another node's GPUs arrive: the
    idle share is worked out from all the attempt's GPU minutes covering it, and the job's running
    and held-idle rows of the minute are shared anew (the idle share only grows as GPUs report).
    """
    covering = list(s.scalars(select(GpuMinuteRow).where(
        GpuMinuteRow.job_id == job_id, GpuMinuteRow.attempt == alloc.attempt, GpuMinuteRow.started_at == start)))
    share = idle_share(alloc, [*covering, *(m for m in minutes if m not in covering)], idle_below)
    if share <= 0.0:
        return
    holders = (f"job:{job_id}", idle_holder(job_id))
    rows = list(s.scalars(select(LedgerRow).where(
        LedgerRow.cluster_id == alloc.cluster_id, LedgerRow.holder.in_(holders), LedgerRow.minute >= start,
        LedgerRow.minute < end, LedgerRow.usage.in_((Usage.RUNNING.value, *HELD_IDLE)))))
    pieces: dict[datetime, dict[str, LedgerRow]] = defaultdict(dict)
    for row in rows:
        pieces[row.minute][row.holder] = row
    first_progress = s.scalar(select(func.min(ProgressRow.at)).where(
        ProgressRow.job_id == job_id, ProgressRow.attempt == alloc.attempt))
    for minute, held in pieces.items():
        running, idle = held.get(holders[0]), held.get(holders[1])
        base = running or idle
        assert base is not None
        gpus = sum(r.gpus for r in (running, idle) if r is not None)
        cost = sum(r.cost for r in (running, idle) if r is not None)
        on_demand = sum(r.on_demand_cost for r in (running, idle) if r is not None)
        if idle is None:
            idle = LedgerRow(
                cluster_id=base.cluster_id, minute=minute, holder=holders[1], job_id=base.job_id, team=base.team,
                usage=_part(s, job_id, alloc, minute, first_progress), cloud=base.cloud, region=base.region,
                zone=base.zone, instance_type=base.instance_type, accelerator=base.accelerator, nodes=base.nodes,
                gpus=0.0, seconds=base.seconds, spot=base.spot, price_per_node_hour=base.price_per_node_hour,
                on_demand_price_per_node_hour=base.on_demand_price_per_node_hour, cost=0.0, on_demand_cost=0.0,
                epoch=base.epoch)
            s.add(idle)
        idle.gpus, idle.cost, idle.on_demand_cost = gpus * share, cost * share, on_demand * share
        if share >= 1.0:
            if running is not None:
                s.delete(running)
        elif running is not None:
            running.gpus, running.cost, running.on_demand_cost = (gpus * (1 - share), cost * (1 - share),
                                                                  on_demand * (1 - share))
        else:  # the whole minute was idle before; not every GPU now (cannot happen: the share only grows)
            idle.gpus, idle.cost, idle.on_demand_cost = gpus, cost, on_demand
    s.flush()
    if first_progress is not None:
        # Idle minutes taken as stalled before the attempt's first progress report was known were startup.
        s.execute(update(LedgerRow).where(
            LedgerRow.cluster_id == alloc.cluster_id, LedgerRow.holder == idle_holder(job_id),
            LedgerRow.usage == Usage.HELD_IDLE_STALLED.value, LedgerRow.minute >= alloc.started_at,
            LedgerRow.minute < first_progress).values(usage=Usage.HELD_IDLE_STARTUP.value))


def _part(s: Session, job_id: str, alloc: AllocationRow, minute: datetime, first_progress: datetime | None) -> str:
    if first_progress is not None and minute < first_progress:
        return Usage.HELD_IDLE_STARTUP.value
    asked = s.scalar(select(func.max(JobEventRow.at)).where(
        JobEventRow.job_id == job_id, JobEventRow.kind == ASKED, JobEventRow.at <= minute,
        JobEventRow.at >= alloc.started_at))
    if asked is not None and minute - asked < CHECKPOINT_WINDOW:
        answered = s.scalar(select(func.min(CheckpointReportRow.written_at)).where(
            CheckpointReportRow.job_id == job_id, CheckpointReportRow.written_at >= asked))
        if answered is None or minute < answered:
            return Usage.HELD_IDLE_CHECKPOINT.value
    return Usage.HELD_IDLE_STALLED.value



def settled(store: Store, job_ids: list[str]) -> bool:
    """Whether the ledger is final for these ended jobs: every cluster they ran on torn down and metered
    to its end (or still up, metered on), and every GPU minute their agents reported split."""
    with store.transaction() as s:
        if s.scalar(select(func.count()).select_from(GpuMinuteRow).where(
                GpuMinuteRow.job_id.in_(job_ids), GpuMinuteRow.attributed_at.is_(None))):
            return False
        clusters = s.execute(select(ClusterRow.state, ClusterRow.metered_until, ClusterRow.terminated_at)
                             .join(AllocationRow, AllocationRow.cluster_id == ClusterRow.id)
                             .where(AllocationRow.job_id.in_(job_ids)))
        for state, metered, terminated in clusters:
            if state == ClusterState.TERMINATING.value or (
                    terminated is not None and (metered is None or metered < terminated)):
                return False
    return True
