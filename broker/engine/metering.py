"""The cost ledger: every second of every cluster, split among the jobs and idle causes holding its GPUs.

A cluster is metered from its launch to its end, per second, as the clouds bill an instance: its
clock minutes (a partial first and last minute prorated), each priced at that minute's quote, and a
cluster gone within a minute of its launch is billed one minute (the clouds' minimum: the seconds
it did not live go to whoever held it last). Each minute splits into pieces wherever who holds the
GPUs changes (the cluster comes up, a job starts, is told to checkpoint, or ends), so a run is
billed for exactly the seconds it held its GPUs, even one that starts and ends inside one minute.
Each piece's cost splits by GPUs: a row per job holding GPUs, with what the job was doing
(provisioning, running, checkpointing and restarting), and a row for the GPUs nobody held, with why
(waiting for work, stranded by fragmentation, held by a finished job until teardown, or queue
drain: the whole cluster between one job's end and the next one's start while a job waits or is
heading to it). A row's ``minute`` is where its piece starts: the clock minute itself unless the
minute is split (or is the launch's). The unique (cluster, minute, holder) key and the cluster's
``metered_until``, moved in the same transaction, make metering a piece twice impossible.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from itertools import pairwise

from sqlalchemy import delete, func, insert, select, update
from sqlalchemy.orm import Session

from broker.clock import Clock
from broker.market.book import Market
from broker.model import JobState, Usage
from broker.store import Store
from broker.store.db import epoch_of
from broker.store.gpu import GpuMinuteRow
from broker.store.tables import AllocationRow, ClusterRow, JobRow, LedgerRow
from providers.base import OfferKey

CHUNK = 500  # ids per IN (...) list
# Clusters a step meters at most (the engine's step): a fleet's minute is spread over a few steps.
PER_STEP = 100


@dataclass(frozen=True, slots=True)
class Share:
    holder: str
    usage: Usage
    gpus: float
    job: JobRow | None = None


@dataclass
class ClusterHistory:
    """What the metering of one cluster needs to know, read once per pass."""

    row: ClusterRow
    allocations: list[AllocationRow]
    jobs: dict[str, JobRow]
    launched_for: JobRow | None
    migrated_in: bool
    queue_waiting: bool
    heading: bool  # a job is on its way to this cluster (placed or reserved, not started yet)

    @classmethod
    def read(cls, s: Session, row: ClusterRow) -> ClusterHistory:
        return cls.read_many(s, [row])[row.id]

    @classmethod
    def read_many(cls, s: Session, rows: list[ClusterRow]) -> dict[str, ClusterHistory]:
        """The histories of ``rows``, read in a few statements for all of them (``CHUNK`` ids per IN list)."""
        ids = [row.id for row in rows]
        allocations: dict[str, list[AllocationRow]] = {cid: [] for cid in ids}
        for start in range(0, len(ids), CHUNK):
            for alloc in s.scalars(select(AllocationRow).where(AllocationRow.cluster_id.in_(ids[start:start + CHUNK]))
                                   .order_by(AllocationRow.started_at, AllocationRow.id)):
                allocations[alloc.cluster_id].append(alloc)
        job_ids = sorted({a.job_id for found in allocations.values() for a in found}
                         | {row.job_id for row in rows if row.job_id})
        jobs: dict[str, JobRow] = {}
        first_start: dict[str, datetime] = {}  # job -> its first allocation's start, on any cluster
        for start in range(0, len(job_ids), CHUNK):
            chunk = job_ids[start:start + CHUNK]
            jobs.update({j.id: j for j in s.scalars(select(JobRow).where(JobRow.id.in_(chunk)))})
            first_start.update({job_id: at for job_id, at in s.execute(
                select(AllocationRow.job_id, func.min(AllocationRow.started_at))
                .where(AllocationRow.job_id.in_(chunk)).group_by(AllocationRow.job_id))})
        queue_waiting = s.scalar(select(JobRow.id).where(JobRow.state == JobState.PENDING.value).limit(1)) is not None
        heading: set[str] = set()
        for start in range(0, len(ids), CHUNK):
            heading.update(s.scalars(select(JobRow.target_cluster_id).where(
                JobRow.target_cluster_id.in_(ids[start:start + CHUNK]),
                JobRow.state.in_([JobState.PROVISIONING.value, JobState.MIGRATING.value])).distinct()))
        histories = {}
        for row in rows:
            launched_for = jobs.get(row.job_id) if row.job_id else None
            began = first_start.get(launched_for.id) if launched_for is not None else None
            histories[row.id] = cls(row, allocations[row.id], jobs, launched_for,
                                    began is not None and began < row.created_at, queue_waiting, row.id in heading)
        return histories

    def changes(self, start: datetime, end: datetime) -> list[datetime]:
        """The moments strictly inside ``start``..``end`` where ``shares`` may change: the pieces' edges."""
        moments = {self.row.up_at}
        for alloc in self.allocations:
            moments |= {alloc.started_at, alloc.stopping_at, alloc.ended_at}
        return sorted(m for m in moments if m is not None and start < m < end)

    def shares(self, minute: datetime) -> list[Share]:
        row = self.row
        total = float(row.num_nodes * row.gpus_per_node) or float(row.num_nodes)
        first_use = Usage.RESTARTING if self.migrated_in else Usage.PROVISIONING
        if row.up_at is not None and minute < row.up_at:
            if self.launched_for is not None:
                return [Share(f"job:{self.launched_for.id}", first_use, total, self.launched_for)]
            return [Share("idle:provisioning", Usage.PROVISIONING, total)]
        shares: list[Share] = []
        held = 0.0
        shared: dict[tuple[str, int], float] = {}  # (node rank, GPU) -> the share of it fractions hold
        for alloc in self.allocations:
            if alloc.started_at <= minute and (alloc.ended_at is None or minute < alloc.ended_at):
                gpus = (float(sum(len(v) for v in alloc.gpus.values())) or total) * (alloc.gpu_share or 1.0)
                job = self.jobs.get(alloc.job_id)
                checkpointing = alloc.stopping_at is not None and minute >= alloc.stopping_at
                usage = Usage.RESTARTING if checkpointing else Usage.RUNNING
                shares.append(Share(f"job:{alloc.job_id}", usage, gpus, job))
                held += gpus
                for rank, on in (alloc.gpus.items() if alloc.gpu_share is not None else ()):
                    for gpu in on:
                        shared[(rank, gpu)] = shared.get((rank, gpu), 0.0) + (alloc.gpu_share or 0.0)
        free = total - held
        if free <= 0:
            return shares
        not_started = not self.allocations or all(a.started_at > minute for a in self.allocations)
        if not_started and self.launched_for is not None:  # up, its job not started yet
            return [*shares, Share(f"job:{self.launched_for.id}", first_use, free, self.launched_for)]
        ended = [a for a in self.allocations if a.ended_at is not None and a.ended_at <= minute]
        if ended and not shares:
            last = ended[-1]
            job = self.jobs.get(last.job_id)
            if last.outcome == "preempted" or (job is not None and not JobState(job.state).terminal):
                return [Share(f"job:{last.job_id}", Usage.RESTARTING, free, job)]
            if self.queue_waiting or self.heading:
                return [Share(f"idle:{Usage.QUEUE_DRAIN.value}", Usage.QUEUE_DRAIN, free)]
            return [Share(f"idle:{Usage.FINISHED.value}", Usage.FINISHED, free)]
        cause = Usage.UNALLOCATED if self.queue_waiting else Usage.WAITING
        # What fractions leave of the GPUs they share is idle too, and stranded (fragmentation).
        stranded = min(sum(max(1.0 - used, 0.0) for used in shared.values()), free)
        idle = [Share(f"idle:{Usage.STRANDED.value}", Usage.STRANDED, stranded)] if stranded > 1e-9 else []
        if free - stranded > 1e-9:
            idle.append(Share(f"idle:{cause.value}", cause, free - stranded))
        return [*shares, *idle]


def meter_cluster(s: Session, row: ClusterRow, now: datetime, market: Market,
                  history: ClusterHistory | None = None, out: list[dict[str, object]] | None = None) -> int:
    """Write the ledger rows of every piece of ``row`` not yet metered; returns rows written.
    ``history``: the cluster's, read with others' (``ClusterHistory.read_many``); None: read here.
    ``out``: the rows are appended there as column values, for the caller to insert (``insert_ledger``)
    in the same transaction; None: inserted here."""
    rows: list[dict[str, object]] = [] if out is None else out
    first = len(rows)
    if row.terminated_at is not None and row.metered_until is not None and row.metered_until > row.terminated_at:
        _take_back(s, row, row.terminated_at)
    start = row.metered_until or row.created_at
    end = min(row.terminated_at, now) if row.terminated_at else now
    key = OfferKey(row.cloud, row.region, row.zone, row.instance_type)
    history = history or ClusterHistory.read(s, row)
    total = float(row.num_nodes * row.gpus_per_node) or float(row.num_nodes)
    minute = start
    while minute < end:
        boundary = minute.replace(second=0, microsecond=0) + timedelta(minutes=1)
        closing = min(boundary, end)
        if closing < boundary and row.terminated_at is None:
            break  # only whole minutes while the cluster lives; the last partial one when it ends
        quote = market.quote(key, minute)
        price = (quote.spot_price if row.spot else quote.on_demand_price) or row.price_per_node_hour
        on_demand = quote.on_demand_price or row.on_demand_price_per_node_hour
        for piece, piece_end in pairwise([minute, *history.changes(minute, closing), closing]):
            seconds = (piece_end - piece).total_seconds()
            if piece_end == row.terminated_at:
                seconds += minimum_shortfall(row)
            for share in history.shares(piece):
                fraction = share.gpus / total
                rows.append(dict(
                    cluster_id=row.id, minute=piece, holder=share.holder,
                    job_id=share.job.id if share.job else None, team=share.job.team if share.job else None,
                    usage=share.usage.value, cloud=row.cloud, region=row.region, zone=row.zone,
                    instance_type=row.instance_type, accelerator=row.accelerator, nodes=row.num_nodes,
                    gpus=share.gpus, seconds=seconds, spot=row.spot, price_per_node_hour=price,
                    on_demand_price_per_node_hour=on_demand,
                    cost=price * row.num_nodes * seconds / 3600.0 * fraction,
                    on_demand_cost=on_demand * row.num_nodes * seconds / 3600.0 * fraction,
                ))
        minute = closing
    row.metered_until = minute
    if out is None:
        insert_ledger(s, rows)
    return len(rows) - first


def insert_ledger(s: Session, rows: list[dict[str, object]]) -> None:
    """Insert ledger rows given as column values, stamped with the fenced transaction's epoch, in one
    executemany (the driver sends one statement for all, not a multi-row INSERT parsed afresh per
    batch as the ORM's flush of added rows did). The session is flushed first: statements run in
    the order the ORM would have run them (a cluster's minutes taken back before they are written again)."""
    if not rows:
        return
    s.flush()
    epoch = epoch_of(s)
    s.execute(insert(LedgerRow), [{**row, "epoch": epoch} for row in rows])


MINUTE = timedelta(minutes=1)
MINIMUM_SECONDS = 60.0  # AWS (Linux spot and on-demand) and GCP bill an instance per second, a minute at least


def minimum_shortfall(row: ClusterRow) -> float:
    """Seconds the clouds bill an ended cluster beyond its life: up to the one-minute minimum."""
    if row.terminated_at is None:
        return 0.0
    return max(MINIMUM_SECONDS - (row.terminated_at - row.created_at).total_seconds(), 0.0)


def meter(store: Store, clock: Clock, market: Market, limit: int | None = None) -> int:
    """Meter every cluster with minutes not yet in the ledger, all in one transaction: their rows
    locked and their histories read in a few statements for all of them, their ledger rows written
    in one flush (batched inserts), whatever the number of clusters. Returns the clusters metered.

    ``limit`` (the engine's step: ``PER_STEP``): at most that many clusters, those metered least far
    first, the rest left to the next calls. Nothing is lost or billed twice either way: a cluster
    metered writes every minute it has not yet written, and moves its ``metered_until`` in the same
    transaction (an engine killed between two calls finds the rest still due).

    A cluster metered past its end (its end learned late, after a broker restart) is taken again,
    so the minutes after its end are taken back.
    """
    now = clock.now()
    with store.transaction() as s:
        due = sorted((metered or created, cluster_id) for cluster_id, created, metered, ended in s.execute(
            select(ClusterRow.id, ClusterRow.created_at, ClusterRow.metered_until, ClusterRow.terminated_at)
            .where(ClusterRow.up_at.is_not(None))
            .where((ClusterRow.metered_until.is_(None))
                   | (ClusterRow.terminated_at.is_(None))
                   | (ClusterRow.metered_until != ClusterRow.terminated_at)))
            if ended is not None or metered is None or metered.replace(second=0, microsecond=0) + MINUTE <= now)
        # (a live cluster is metered in whole minutes: one whose next minute has not ended has nothing to write)
        ids = sorted(cluster_id for _, cluster_id in (due if limit is None else due[:limit]))
        if not ids:
            return 0
        rows: list[ClusterRow] = []
        for start in range(0, len(ids), CHUNK):  # locked in id order, as one transaction per cluster did
            rows += s.scalars(select(ClusterRow).where(ClusterRow.id.in_(ids[start:start + CHUNK]))
                              .order_by(ClusterRow.id).with_for_update())
        histories = ClusterHistory.read_many(s, rows)
        ledger: list[dict[str, object]] = []
        for row in rows:
            meter_cluster(s, row, now, market, histories[row.id], ledger)
        insert_ledger(s, ledger)
        return len(rows)


def _take_back(s: Session, row: ClusterRow, ended: datetime) -> None:
    """Delete the minutes metered from the one ``ended`` falls in: the cluster was gone (its end was learned late)."""
    restart = max(ended.replace(second=0, microsecond=0), row.created_at)
    s.execute(delete(LedgerRow).where(LedgerRow.cluster_id == row.id, LedgerRow.minute >= restart))
    # Those minutes' split by what their GPUs did went with them: split them again once re-metered.
    s.execute(update(GpuMinuteRow).where(GpuMinuteRow.cluster_id == row.id, GpuMinuteRow.ended_at > restart)
              .values(attributed_at=None))
    row.metered_until = restart
