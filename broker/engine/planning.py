"""The selection policy's question: the one builder of a ``SelectionRequest``.

The engine asks it for a job in the store; the SkyPilot dry run asks it for a job file not yet
submitted. Both go through ``offer_of`` and ``fitting`` (quotes the job's nodes fit, exact sizes
first) and ``job_view``, so a plan previewed is a plan the engine would make. The simulator asks
the same policy the same question from its arrays, with its job seen through the same
``job_view``; ``tests/broker/test_policy_parity.py`` holds the two to it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TYPE_CHECKING

from sqlalchemy import select
from sqlalchemy.orm import Session

from broker.engine.checkpoints import current_allocation, progress_of, progress_s
from broker.engine.parts import Parts, Place
from broker.market.capacity import capacity_score_of, prior_uptime_s
from broker.model import ClusterState, JobState, TeardownReason
from broker.spec.job import JobSpec
from broker.store.tables import AllocationRow, ClusterRow, JobRow, NoticeRow
from policies.history import MarketHistory, MarketSeries
from policies.selection import IDLE, ON_DEMAND, JobView, Location, Plan, SelectionRequest, ZoneOffer, ZoneRecord
from policies.work_estimate import MAX_PAST_RUNS, WorkEstimate, estimate_work
from providers.base import OfferKey, SpotQuote

if TYPE_CHECKING:
    from broker.market.book import Market

CHUNK = 500  # ids per IN (...) list
# How long a zone that preempted or refused a job stays off that job's plans.
AVOID_ZONE_FOR = timedelta(hours=1)
# How long a spot offer whose launch failed is left alone, on a market without ticks.
LAUNCH_BACKOFF = timedelta(minutes=5)
# How often a running job's place is reviewed on a market without ticks.
REVIEW_SECONDS = 300.0


def offer_of(quote: SpotQuote) -> ZoneOffer:
    return ZoneOffer(quote.cloud, quote.region, quote.zone, quote.instance_type, quote.accelerator,
                     quote.gpus_per_node, float(quote.spot_price or math.inf),
                     float(quote.on_demand_price or math.inf), quote.available_nodes, capacity_score_of(quote),
                     prior_uptime_s(quote))


def fits_node(spec: JobSpec, accelerator: str, gpus_per_node: int, exact: bool = False,
         instance_type: str | None = None, cloud: str | None = None) -> bool:
    """The job's nodes fit one of ``gpus_per_node`` ``accelerator`` GPUs (``exact``: of just that size).

    A task without accelerators fits only a node without GPUs (a GPU node would idle its GPUs) whose
    shape in the built-in catalog has the task's ``cpus`` and ``memory``, of the type it names if any.
    A choice tied to instance types (`instance_type` named with `accelerators`) fits only those."""
    if not spec.accelerators:
        return gpus_per_node == 0 and _cpu_node_fits(spec, instance_type, cloud)
    return any(a.name.lower() == accelerator.lower()
               and (a.count == gpus_per_node if exact else a.count <= gpus_per_node)
               and a.on(instance_type)
               for a in spec.accelerators)


def _cpu_node_fits(spec: JobSpec, instance_type: str | None, cloud: str | None) -> bool:
    if spec.instance_types and instance_type not in spec.instance_types:
        return False
    if spec.min_cpus is None and spec.min_memory_gb is None:
        return True
    from providers.catalog import find_any

    shape = find_any(instance_type, cloud) if instance_type else None
    if shape is None:
        return False  # a shape the catalog does not know cannot be promised to hold the task
    return (spec.min_cpus is None or shape.vcpus >= spec.min_cpus) and \
        (spec.min_memory_gb is None or shape.memory_gb >= spec.min_memory_gb)


def fitting(spec: JobSpec, quotes: list[SpotQuote]) -> tuple[list[SpotQuote], bool]:
    """Priced quotes of nodes of exactly the asked size when the market has them (True), else of
    bigger ones, whose other GPUs can host other gangs (False)."""
    priced = [q for q in quotes if q.spot_price is not None and q.on_demand_price is not None]
    exact = [q for q in priced if fits_node(spec, q.accelerator, q.gpus_per_node, True, q.instance_type, q.cloud)]
    if exact:
        return exact, True
    loose = [q for q in priced if fits_node(spec, q.accelerator, q.gpus_per_node, False, q.instance_type, q.cloud)]
    return loose, False


@dataclass(frozen=True, slots=True)
class JobLimits:
    """What a job file limits its placement to: a price cap for the gang, clouds, stated speeds."""

    max_price_per_hour: float | None = None
    allowed_places: frozenset[tuple[str, str | None]] = frozenset()  # (cloud, region or None); empty: any
    speed: tuple[tuple[str, float], ...] = ()

    @classmethod
    def of(cls, spec: JobSpec) -> JobLimits:
        return cls(spec.broker.max_price, spec.allowed_regions, spec.broker.speed)


def job_view(limits: JobLimits, num_nodes: int, gpus_per_node: int, accelerator: str | None,
             remaining_work_s: float | None, deadline: datetime | None, restart_overhead_s: float,
             checkpoint_gb: float = 0.0, total_work_s: float | None = None,
             started_at: datetime | None = None) -> JobView:
    """The job as every policy sees it, built the same way by the engine, the dry run and the simulator."""
    return JobView(
        num_nodes=num_nodes, gpus_per_node=gpus_per_node, accelerator=accelerator,
        remaining_work_s=remaining_work_s, deadline=deadline, restart_overhead_s=restart_overhead_s,
        checkpoint_gb=checkpoint_gb, max_price_per_hour=limits.max_price_per_hour,
        allowed_places=limits.allowed_places, total_work_s=total_work_s, started_at=started_at, speed=limits.speed,
    )


def preview_request(spec: JobSpec, quotes: list[SpotQuote], now: datetime, restart_overhead_s: float,
                    past: Market | None = None) -> SelectionRequest:
    """The request for a job file not yet submitted, placed nowhere, with no history of its own
    (but, from a live ``past`` market, the recent past of its offers, as the engine would see it)."""
    offers, _ = fitting(spec, quotes)
    recent = past.recent([q.key for q in offers], now) if past is not None and offers else None
    history = MarketHistory(MarketSeries.from_trace(recent), recent.num_ticks - 1) if recent is not None else None
    work = spec.broker.work
    view = job_view(JobLimits.of(spec), spec.num_nodes, spec.gpus_per_node, spec.accelerator,
                    work.total_seconds() if work is not None else None, spec.broker.deadline_at(now),
                    restart_overhead_s)
    return SelectionRequest(now=now, job=view, offers=tuple(offer_of(q) for q in offers), current=Location(IDLE),
                            record={}, excluded=frozenset(), history=history,
                            step_s=recent.tick_seconds if recent is not None else None)


@dataclass
class Reads:
    """What the requests of many jobs in one pass (the running jobs' reviews) need from the store, read
    at once for all of them: every zone's record, each job's allocations (its progress, its current
    one) and where its checkpoint lives, and the finished runs of a name and team (read once per pair)."""

    records: dict[str, ZoneRecord]
    allocations: dict[str, list[AllocationRow]]
    regions: dict[str, str | None]
    past: dict[tuple[str, str | None], list[float]]

    @classmethod
    def of(cls, s: Session, jobs: list[JobRow]) -> Reads:
        ids = [job.id for job in jobs]
        allocations: dict[str, list[AllocationRow]] = {job_id: [] for job_id in ids}
        regions: dict[str, tuple[int, str]] = {}
        for start in range(0, len(ids), CHUNK):
            chunk = ids[start:start + CHUNK]
            for alloc in s.scalars(select(AllocationRow).where(AllocationRow.job_id.in_(chunk))):
                allocations[alloc.job_id].append(alloc)
            for job_id, attempt, cloud, region in s.execute(
                    select(AllocationRow.job_id, AllocationRow.attempt, ClusterRow.cloud, ClusterRow.region)
                    .join(ClusterRow, ClusterRow.id == AllocationRow.cluster_id)
                    .where(AllocationRow.job_id.in_(chunk), ClusterRow.spot.is_(True))):
                if job_id not in regions or attempt > regions[job_id][0]:
                    regions[job_id] = (attempt, f"{cloud}/{region}")
        return cls(zone_records(s), allocations,
                   {job.id: regions[job.id][1] if job.checkpoint is not None and job.id in regions else None
                    for job in jobs}, {})

    def current(self, job: JobRow) -> AllocationRow | None:
        """``current_allocation``, from what was read."""
        if job.attempt == 0:
            return None
        return next((a for a in self.allocations.get(job.id, []) if a.attempt == job.attempt), None)


class Planner:
    """Builds the engine's requests and asks the selection policy."""

    def __init__(self, parts: Parts) -> None:
        self.parts = parts
        self._series: dict[tuple[str, int], MarketSeries] = {}

    def plan(self, s: Session, job: JobRow, current: Location, exclude: set[str], reads: Reads | None = None) -> Plan:
        return self.parts.selection(self.selection_request(s, job, current, exclude, reads))

    def selection_request(self, s: Session, job: JobRow, current: Location, exclude: set[str],
                          reads: Reads | None = None) -> SelectionRequest:
        """What the selection policy sees: the same request the simulator builds for the same moment.
        ``reads``: what the pass read for many jobs at once (the same facts as read here one by one)."""
        parts = self.parts
        spec = parts.spec_of(job)
        now = self.policy_now()
        quotes, exact = fitting(spec, parts.market.quotes(now))
        work = work_estimate(s, job, parts.clock.now(), reads)
        alloc = current_allocation(s, job) if reads is None else reads.current(job)
        in_location = (now - (alloc.running_at or alloc.started_at)).total_seconds() \
            if alloc is not None and alloc.ended_at is None and current.kind != IDLE else 0.0
        history, step_s = self._history(now, quotes, exact)
        options = parts.options
        view = job_view(JobLimits.of(spec), job.num_nodes, job.gpus_per_node, job.accelerator, work.remaining_s,
                        job.deadline, options.restart_overhead_s, options.checkpoint_gb, work.total_s, job.created_at)
        return SelectionRequest(
            now=now, job=view, offers=tuple(offer_of(q) for q in quotes), current=current,
            record=zone_records(s) if reads is None else reads.records, excluded=frozenset(exclude),
            history=history, step_s=step_s, in_location_s=in_location,
            checkpoint_region=checkpoint_region(s, job) if reads is None else reads.regions.get(job.id),
            egress_per_gb=options.egress_per_gb,
        )

    def policy_now(self) -> datetime:
        """The moment a policy reasons about: on a replayed trace, the start of the current tick (as simulated)."""
        return self.parts.market.tick_start(self.parts.clock.now())

    def review_seconds(self) -> float:
        """How often a running job's place is reviewed: once per market tick."""
        return self.parts.market.tick_seconds or REVIEW_SECONDS

    def _history(self, now: datetime, quotes: list[SpotQuote],
                 exact: bool) -> tuple[MarketHistory | None, float | None]:
        """The market's past for the policy: a replayed trace's whole past of the job's kind of node
        (when its nodes fit exactly), or a live market's recent past of the offers asked about."""
        market = self.parts.market
        if market.tick_seconds is None:
            recent = market.recent([q.key for q in quotes], now) if quotes else None
            if recent is None:
                return None, None
            return MarketHistory(MarketSeries.from_trace(recent), recent.num_ticks - 1), recent.tick_seconds
        if not exact or not quotes:
            return None, None
        like = quotes[0]
        key = (like.accelerator, like.gpus_per_node)
        if key not in self._series:
            past = market.past(like.accelerator, like.gpus_per_node)
            if past is None:
                return None, None
            self._series[key] = MarketSeries.from_trace(past)
        return MarketHistory(self._series[key], market.tick_at(now)), market.tick_seconds

    def location_of(self, cluster: Place) -> Location:
        """Where a cluster is, as the policy names places: on demand, or a spot offer at today's price."""
        if not cluster.spot:
            return Location(ON_DEMAND)
        key = OfferKey(cluster.cloud, cluster.region, cluster.zone, cluster.instance_type)
        return Location("spot", offer_of(self.parts.market.quote(key, self.parts.clock.now())))

    def avoid(self, s: Session, job: JobRow) -> set[str]:
        """Spot zones this job was preempted from or refused by recently."""
        since = self.parts.clock.now() - AVOID_ZONE_FOR
        where = (ClusterRow.cloud, ClusterRow.region, ClusterRow.zone, ClusterRow.instance_type)
        rows = s.execute(select(*where).where(ClusterRow.job_id == job.id, ClusterRow.spot.is_(True),
                                              ClusterRow.terminated_at.is_not(None), ClusterRow.terminated_at >= since))
        notices = s.execute(select(*where).join(NoticeRow, NoticeRow.cluster_id == ClusterRow.id)
                            .where(ClusterRow.job_id == job.id))
        return {str(OfferKey(*row)) for row in (*rows, *notices)} | self.refused_lately(s)

    def refused_lately(self, s: Session) -> set[str]:
        """Spot offers a launch (for any job) failed in since the market last changed: on a replayed trace,
        within the current tick; on a live market, within ``LAUNCH_BACKOFF``. Launching the next job into a
        zone that just said no would only fail again (and, on the local backend, start a process to do so)."""
        market, now = self.parts.market, self.parts.clock.now()
        since = market.tick_start(now) if market.tick_seconds else now - LAUNCH_BACKOFF
        rows = s.execute(select(ClusterRow.cloud, ClusterRow.region, ClusterRow.zone, ClusterRow.instance_type)
                         .where(ClusterRow.state == ClusterState.FAILED.value, ClusterRow.spot.is_(True),
                                ClusterRow.teardown_reason == TeardownReason.LAUNCH_FAILED.value,
                                ClusterRow.terminated_at >= since).distinct())
        return {str(OfferKey(*row)) for row in rows}


def work_estimate(s: Session, job: JobRow, now: datetime, reads: Reads | None = None) -> WorkEstimate:
    """The job's work: stated, else the median of its name and team's finished runs, else unknown."""
    done = progress_s(s, job, now) if reads is None else progress_of(reads.allocations.get(job.id, []), job, now)
    past: list[float] = []
    if job.work_s is None:
        if reads is not None and (job.name, job.team) in reads.past:
            return estimate_work(job.work_s, done, reads.past[(job.name, job.team)])
        # A finished job is never one of the running jobs a pass reads for: the same runs for each of them.
        rows = s.scalars(select(JobRow).where(JobRow.name == job.name, JobRow.team == job.team,
                                              JobRow.state == JobState.SUCCEEDED.value, JobRow.id != job.id)
                         .order_by(JobRow.finished_at.desc()).limit(MAX_PAST_RUNS))
        past = [progress_s(s, row, now) for row in rows]
        if reads is not None:
            reads.past[(job.name, job.team)] = past
    return estimate_work(job.work_s, done, past)


def checkpoint_region(s: Session, job: JobRow) -> str | None:
    """Where the job's checkpoint lives: the region of the last spot cluster it ran on."""
    if job.checkpoint is None:
        return None
    row = s.execute(select(ClusterRow.cloud, ClusterRow.region).join(
        AllocationRow, AllocationRow.cluster_id == ClusterRow.id).where(
        AllocationRow.job_id == job.id, ClusterRow.spot.is_(True)).order_by(AllocationRow.attempt.desc())).first()
    return f"{row[0]}/{row[1]}" if row else None


def zone_records(s: Session) -> dict[str, ZoneRecord]:
    """Every spot zone's past: when it preempted a cluster and when it refused a launch."""
    preempted: dict[str, list[datetime]] = {}
    failed: dict[str, list[datetime]] = {}
    rows = s.execute(select(ClusterRow.cloud, ClusterRow.region, ClusterRow.zone, ClusterRow.instance_type,
                            ClusterRow.state, ClusterRow.teardown_reason, ClusterRow.terminated_at, ClusterRow.spot)
                     .where(ClusterRow.state.in_([ClusterState.FAILED.value, ClusterState.TERMINATED.value])))
    for cloud, region, zone, instance_type, state, reason, ended, spot in rows:
        if ended is None or not spot:
            continue
        key = str(OfferKey(cloud, region, zone, instance_type))
        if state == ClusterState.FAILED.value:
            failed.setdefault(key, []).append(ended)
        elif reason == TeardownReason.CLOUD.value:  # the cloud took it back
            preempted.setdefault(key, []).append(ended)
    keys = set(preempted) | set(failed)
    return {k: ZoneRecord(tuple(sorted(preempted.get(k, []))), tuple(sorted(failed.get(k, [])))) for k in keys}


def same_place(target: Location, here: Location) -> bool:
    if target.kind != here.kind:
        return False
    if target.kind != "spot":
        return True
    return target.offer is not None and here.offer is not None and target.offer.location == here.offer.location
