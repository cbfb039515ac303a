"""The engine: the job state machine, driven one idempotent step at a time.

Each ``step()`` reads the store, asks the provisioner where things stand, and moves every job
on by at most one transition, each in its own transaction. Nothing is kept in memory that the
store does not also hold (the parsed-spec cache is only a cache), so an engine started after a
crash picks up exactly where the last one stopped: a cluster row is written before its launch is
asked for, and launches, job starts and stops are idempotent in the provisioner.

A job waiting to run goes, in order of preference, onto free GPUs of a cluster that is already
up (placed by the placement policy), onto a new cluster (chosen by the selection policy, within
the fleet's GPU limit), or onto GPUs taken from lower-priority gangs (the preemption policy),
which are checkpointed through their agents and requeued.
"""

from __future__ import annotations

import hashlib
import logging
import math
import secrets
import threading
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from sqlalchemy import func, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from broker import packing
from broker.agent.checkpoint import latest_checkpoint
from broker.clock import Clock
from broker.metering import TERMINATE_KINDS, meter_cluster
from broker.model import ClusterState, GangPlacement, JobState, check_transition
from broker.provision.base import ClusterInfo, ClusterPhase, JobLaunch, Provisioner, RunPhase
from broker.spec import JobSpec, job_spec_from_data
from broker.store import Store
from broker.store.tables import AllocationRow, ClusterRow, JobEventRow, JobRow, NoticeRow
from policies import registry
from policies.history import MarketHistory, MarketSeries
from policies.preemption import PreemptionRequest
from policies.selection import IDLE, ON_DEMAND, JobView, Location, Plan, SelectionRequest, ZoneOffer, ZoneRecord
from policies.work_estimate import MAX_PAST_RUNS, WorkEstimate, estimate_work
from providers.base import OfferKey, SpotQuote

if TYPE_CHECKING:
    from broker.config import Settings

log = logging.getLogger("broker.engine")

ACTIVE_STATES = [s.value for s in JobState if not s.terminal]
LIVE_CLUSTER_STATES = [s.value for s in ClusterState if s.live]
# How long a zone that preempted or refused a job stays off that job's plans.
AVOID_ZONE_FOR = timedelta(hours=1)


class UnknownJob(LookupError):
    def __str__(self) -> str:
        return str(self.args[0])


class MarketView(Protocol):
    def quotes(self, when: datetime) -> list[SpotQuote]: ...

    def quote(self, key: OfferKey, when: datetime) -> SpotQuote: ...


def hash_token(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def cluster_info(row: ClusterRow, token: str | None = None) -> ClusterInfo:
    return ClusterInfo(row.id, row.cloud, row.region, row.zone, row.instance_type, row.num_nodes,
                       row.gpus_per_node, row.spot, token, dict(row.handle or {}))


@dataclass(frozen=True)
class EngineOptions:
    home: Path
    selection_policy: str | None = None
    placement_policy: str | None = None
    preemption_policy: str | None = None
    broker_url: str | None = None
    restart_overhead_s: float = 720.0
    checkpoint_gb: float = 0.0  # size of a job's checkpoint, for the cost of moving it between regions
    egress_per_gb: float = 0.02  # USD per GB moved between regions or clouds
    max_gpus: int | None = None  # GPUs the broker may hold across all its clusters
    # A gate a PENDING job must pass before it is planned (the service's capacity shares); None: all pass.
    admit: Callable[[Session, JobRow], bool] | None = None


def engine_options(settings: Settings, broker_url: str | None, **extra: Any) -> EngineOptions:
    """The engine's options as the settings give them; every runtime (embedded, service, SkyPilot) uses this."""
    local = settings.backend == "local"
    overhead = settings.restart_overhead_s or (settings.local_provision_seconds + 60.0 if local else 720.0)
    return EngineOptions(
        home=settings.home, selection_policy=settings.selection_policy,
        placement_policy=settings.placement_policy, preemption_policy=settings.preemption_policy,
        max_gpus=settings.max_gpus, restart_overhead_s=overhead, broker_url=broker_url, **extra,
    )


@dataclass
class _AfterCommit:
    """Provisioner calls decided inside a transaction, made once it has committed."""

    launches: list[ClusterInfo]
    starts: list[tuple[ClusterInfo, JobLaunch]]
    terminations: list[ClusterInfo]
    signals: list[tuple[ClusterInfo, str, int, str]]
    stops: list[tuple[ClusterInfo, str, int]]

    @classmethod
    def empty(cls) -> _AfterCommit:
        return cls([], [], [], [], [])


class Engine:
    def __init__(self, store: Store, clock: Clock, market: MarketView, provisioner: Provisioner,
                 options: EngineOptions, tokens: Callable[[str], str]) -> None:
        self.store = store
        self.clock = clock
        self.market = market
        self.provisioner = provisioner
        self.options = options
        self.policy = registry.get("selection", options.selection_policy)
        self.placement = registry.get("placement", options.placement_policy)
        self.preemption = registry.get("preemption", options.preemption_policy)
        # cluster id -> the token its agents authenticate with; the store keeps only hashes.
        self.tokens = tokens
        self._specs: dict[str, JobSpec] = {}
        self._series: dict[tuple[str | None, int], MarketSeries] = {}
        self._asked: dict[str, int] = {}  # job id -> the market tick its running location was last reviewed
        self._lock = threading.Lock()

    # ----------------------------------------------------------------- submission

    def submit(self, spec: JobSpec) -> str:
        job_id = submit_job(self.store, self.clock, spec, self.options.home, self.provisioner.name)
        self._specs[job_id] = spec
        return job_id

    def spec_of(self, job: JobRow) -> JobSpec:
        if job.id not in self._specs:
            # Validated at submission; re-reading it must not consult catalogs or the clock again.
            self._specs[job.id] = job_spec_from_data(job.spec, source=job.spec_path or job.name, offline=True)
        return self._specs[job.id]

    # ----------------------------------------------------------------- the step

    def step(self) -> None:
        with self._lock:
            self._sync_clusters()
            for job_id in self._active_ids():
                self._advance(job_id)
            # A job that ended above freed GPUs: queued jobs take them before idle clusters are reaped.
            for job_id in self._active_ids(JobState.PENDING):
                self._advance(job_id)
            self._reap()
            self._meter()

    def _active_ids(self, only: JobState | None = None) -> list[str]:
        states = [only.value] if only else ACTIVE_STATES
        with self.store.transaction() as s:
            return list(s.scalars(select(JobRow.id).where(JobRow.state.in_(states))
                                  .order_by(JobRow.priority.desc(), JobRow.created_at)))

    def active_jobs(self) -> list[str]:
        return self._active_ids()

    def _advance(self, job_id: str) -> None:
        after = _AfterCommit.empty()
        with self.store.transaction() as s:
            job = s.get(JobRow, job_id, with_for_update=True)
            if job is None or JobState(job.state).terminal:
                return
            state = JobState(job.state)
            if state is JobState.PENDING:
                if self.options.admit is not None and not self.options.admit(s, job):
                    return
                self._from_pending(s, job, after)
            elif state in (JobState.PROVISIONING, JobState.MIGRATING):
                self._from_provisioning(s, job, after)
            elif state is JobState.RUNNING:
                self._from_running(s, job, after)
            elif state is JobState.CHECKPOINTING:
                self._from_checkpointing(s, job, after)
        self._carry_out(after)
        if after.launches or not JobState(job.state).terminal:
            self._start_if_ready(job_id)

    def _carry_out(self, after: _AfterCommit) -> None:
        for info in after.terminations:
            self.provisioner.terminate(info)
        for info, job_id, attempt, signal in after.signals:
            self.provisioner.signal_job(info, job_id, attempt, signal)
        for info, job_id, attempt in after.stops:
            self.provisioner.stop_job(info, job_id, attempt)
        for info in after.launches:
            self.provisioner.launch(info)
        for info, launch in after.starts:
            self.provisioner.start_job(info, launch)

    def _transition(self, s: Session, job: JobRow, target: JobState, **detail: object) -> None:
        current = JobState(job.state)
        check_transition(current, target)
        now = self.clock.now()
        job.state = target.value
        job.updated_at = now
        if target.terminal:
            job.finished_at = now
            job.wall_finished_at = _wall_now()
            job.target_cluster_id = job.target_gpus = None
        s.add(JobEventRow(job_id=job.id, at=now, kind="transition", from_state=current.value,
                          to_state=target.value, detail=_jsonable(detail)))
        log.info("job %s: %s -> %s %s", job.id, current, target, detail or "")

    def _event(self, s: Session, job_id: str | None, kind: str, **detail: object) -> None:
        if job_id is not None:
            s.add(JobEventRow(job_id=job_id, at=self.clock.now(), kind=kind, detail=_jsonable(detail)))

    # ----------------------------------------------------------------- clusters
    def _sync_clusters(self) -> None:
        with self.store.transaction() as s:
            rows = list(s.scalars(select(ClusterRow).where(ClusterRow.state.in_(LIVE_CLUSTER_STATES))))
        for row in rows:
            info = cluster_info(row, self.tokens(row.id))
            status = self.provisioner.status(info)
            now = self.clock.now()
            if status.phase is ClusterPhase.UNKNOWN and row.state == ClusterState.PROVISIONING:
                self.provisioner.launch(info)  # written to the store but never launched: a crash
                continue
            if status.notice_action_at is not None:
                self._record_backend_notice(row.id, status.notice_action_at)
            with self.store.transaction() as s:
                current = s.get(ClusterRow, row.id)
                if current is None or current.state != row.state:
                    continue
                if status.handle:
                    current.handle = {**(current.handle or {}), **status.handle}
                if status.phase is ClusterPhase.UP and current.state == ClusterState.PROVISIONING:
                    current.state = ClusterState.UP.value
                    current.up_at = status.up_at or now
                elif status.phase is ClusterPhase.FAILED:
                    current.state = ClusterState.FAILED.value
                    current.reason = status.reason
                    current.terminated_at = now
                    self._event(s, current.job_id, "launch_failed", cluster=current.id, zone=current.zone,
                                reason=status.reason, capacity=status.capacity_error)
                elif status.phase in (ClusterPhase.TERMINATED, ClusterPhase.UNKNOWN):
                    current.state = ClusterState.TERMINATED.value
                    current.reason = current.reason or status.reason
                    current.terminated_at = min(status.ended_at or now, now)
                    if current.up_at is None:
                        current.up_at = current.terminated_at

    def _record_backend_notice(self, cluster_id: str, action_at: datetime) -> None:
        """A notice the backend saw: recorded unless an agent's report got there first."""
        with self.store.transaction() as s:
            if s.scalar(select(NoticeRow.id).where(NoticeRow.dedup_key == f"{cluster_id}:terminate")) is not None:
                return
        try:
            with self.store.transaction() as s:
                s.add(NoticeRow(dedup_key=f"{cluster_id}:terminate", cluster_id=cluster_id, node="*",
                                kind="terminate", source="backend", action_time=action_at,
                                received_at=self.clock.now(), detail={}))
        except IntegrityError:
            pass  # an agent's report won the race: the same notice, recorded once

    def _fleet_gpus(self, s: Session, leaving: str | None = None) -> int:
        """GPUs of every cluster up or coming up (not counting ``leaving``, which a migration releases)."""
        query = select(func.coalesce(func.sum(ClusterRow.num_nodes * ClusterRow.gpus_per_node), 0)).where(
            ClusterRow.state.in_([ClusterState.PROVISIONING.value, ClusterState.UP.value]))
        if leaving is not None:
            query = query.where(ClusterRow.id != leaving)
        return int(s.scalar(query) or 0)

    def _launch(self, s: Session, job: JobRow, plan: Plan, exclude: set[str], after: _AfterCommit,
                leaving: str | None = None) -> ClusterRow | None:
        """Write the cluster row for the plan's first usable location; it is launched after commit."""
        for location in plan.locations:
            if location.offer is None or location.kind == IDLE:
                continue
            offer = location.offer
            spot = location.kind != ON_DEMAND
            if spot and offer.location in exclude:
                continue
            gpus = job.num_nodes * offer.gpus_per_node
            if self.options.max_gpus is not None and self._fleet_gpus(s, leaving) + gpus > self.options.max_gpus:
                self._event(s, job.id, "fleet_full", max_gpus=self.options.max_gpus)
                return None
            sequence = int(s.scalar(select(func.count()).select_from(ClusterRow)
                                    .where(ClusterRow.job_id == job.id)) or 0) + 1
            cluster_id = f"{job.id}-c{sequence}"
            row = ClusterRow(
                id=cluster_id, launch_key=f"{job.id}:{sequence}", job_id=job.id,
                backend=self.provisioner.name, cloud=offer.cloud, region=offer.region, zone=offer.zone,
                instance_type=offer.instance_type, accelerator=offer.accelerator,
                gpus_per_node=offer.gpus_per_node, num_nodes=job.num_nodes, spot=spot,
                price_per_node_hour=offer.spot_price if spot else offer.on_demand_price,
                on_demand_price_per_node_hour=offer.on_demand_price, state=ClusterState.PROVISIONING.value,
                token_hash=hash_token(self.tokens(cluster_id)), handle={}, created_at=self.clock.now(),
            )
            s.add(row)
            job.target_cluster_id = row.id
            job.target_gpus = self._first_claim(row, job).to_json()
            self._event(s, job.id, "launch", cluster=row.id, zone=offer.zone, cloud=offer.cloud,
                        spot=spot, price=row.price_per_node_hour, reason=plan.reason)
            after.launches.append(cluster_info(row, self.tokens(row.id)))
            return row
        return None

    def _first_claim(self, row: ClusterRow, job: JobRow) -> GangPlacement:
        """The launching job's GPUs on its new cluster: all of them, or the best-connected subset."""
        per_node = job.gpus_per_node or row.gpus_per_node
        if per_node >= row.gpus_per_node:
            return GangPlacement.whole_nodes(row.id, row.num_nodes, row.gpus_per_node)
        empty = packing.ClusterSnapshot.empty(row.id, packing.node_topology(row), row.num_nodes)
        placement = self.placement(packing.gang_request(job, self.spec_of(job), per_node), empty)
        assert placement is not None, "a gang always fits an empty cluster launched for it"
        return placement  # type: ignore[no-any-return]

    # ----------------------------------------------------------------- planning

    def _plan(self, s: Session, job: JobRow, current: Location, exclude: set[str]) -> Plan:
        return self.policy(self.selection_request(s, job, current, exclude))  # type: ignore[no-any-return]

    def selection_request(self, s: Session, job: JobRow, current: Location, exclude: set[str]) -> SelectionRequest:
        """What the selection policy sees: the same request the simulator builds for the same moment."""
        spec = self.spec_of(job)
        now = self._policy_now()
        quotes = [q for q in self.market.quotes(now) if q.spot_price is not None and q.on_demand_price is not None]
        # Nodes of exactly the asked size when the market has them; bigger ones (whose other GPUs
        # can host other gangs) only when it has none.
        exact = [q for q in quotes if _fits(spec, q, exact=True)]
        fitting = exact or [q for q in quotes if _fits(spec, q)]
        offers = tuple(
            ZoneOffer(q.cloud, q.region, q.zone, q.instance_type, q.accelerator, q.gpus_per_node,
                      float(q.spot_price or math.inf), float(q.on_demand_price or math.inf),
                      q.available_nodes, q.capacity_score)
            for q in fitting
        )
        work = self.work_estimate(s, job)
        alloc = self._current_allocation(s, job)
        in_location = (now - (alloc.running_at or alloc.started_at)).total_seconds() \
            if alloc is not None and alloc.ended_at is None and current.kind != IDLE else 0.0
        history, step_s = self._history(now, fitting[0] if exact and fitting else None)
        return SelectionRequest(
            now=now,
            job=JobView(
                num_nodes=job.num_nodes, gpus_per_node=job.gpus_per_node, accelerator=job.accelerator,
                remaining_work_s=work.remaining_s, deadline=job.deadline,
                restart_overhead_s=self.options.restart_overhead_s, checkpoint_gb=self.options.checkpoint_gb,
                max_price_per_hour=spec.broker.max_price,
                allowed_clouds=frozenset(c.cloud for c in spec.broker.clouds),
                total_work_s=work.total_s, started_at=job.created_at, speed=spec.broker.speed,
            ),
            offers=offers,
            current=current,
            record=self._zone_records(s),
            excluded=frozenset(exclude),
            history=history,
            step_s=step_s,
            checkpoint_region=self._checkpoint_region(s, job),
            in_location_s=in_location,
            egress_per_gb=self.options.egress_per_gb,
        )

    def work_estimate(self, s: Session, job: JobRow) -> WorkEstimate:
        """The job's work: stated, else the median of its name and team's finished runs, else unknown."""
        done = self._progress_s(s, job)
        past: list[float] = []
        if job.work_s is None:
            rows = s.scalars(select(JobRow).where(JobRow.name == job.name, JobRow.team == job.team,
                                                  JobRow.state == JobState.SUCCEEDED.value, JobRow.id != job.id)
                             .order_by(JobRow.finished_at.desc()).limit(MAX_PAST_RUNS))
            past = [self._progress_s(s, row) for row in rows]
        return estimate_work(job.work_s, done, past)

    def _policy_now(self) -> datetime:
        """The moment a policy reasons about: on a replayed trace, the start of the current tick (as simulated)."""
        now = self.clock.now()
        if getattr(self.market, "trace", None) is None:
            return now
        return self.market.time_of(self.market.tick_at(now))  # type: ignore[attr-defined,no-any-return]

    def _history(self, now: datetime, like: SpotQuote | None) -> tuple[MarketHistory | None, float | None]:
        """The market's past for the policy, where the market is a replayed trace (the local backend)."""
        trace = getattr(self.market, "trace", None)
        if trace is None or like is None:
            return None, None
        key = (like.accelerator, like.gpus_per_node)
        if key not in self._series:
            self._series[key] = MarketSeries.from_trace(trace.select(like.accelerator, like.gpus_per_node))
        return MarketHistory(self._series[key], self.market.tick_at(now)), trace.tick_seconds  # type: ignore[attr-defined]

    def _checkpoint_region(self, s: Session, job: JobRow) -> str | None:
        """Where the job's checkpoint lives: the region of the last spot cluster it ran on."""
        if job.checkpoint is None:
            return None
        row = s.execute(select(ClusterRow.cloud, ClusterRow.region).join(
            AllocationRow, AllocationRow.cluster_id == ClusterRow.id).where(
            AllocationRow.job_id == job.id, ClusterRow.spot.is_(True)).order_by(AllocationRow.attempt.desc())).first()
        return f"{row[0]}/{row[1]}" if row else None

    def _zone_records(self, s: Session) -> dict[str, ZoneRecord]:
        preempted: dict[str, list[datetime]] = {}
        failed: dict[str, list[datetime]] = {}
        rows = s.execute(select(ClusterRow.cloud, ClusterRow.zone, ClusterRow.instance_type, ClusterRow.state,
                                ClusterRow.reason, ClusterRow.terminated_at, ClusterRow.spot)
                         .where(ClusterRow.state.in_([ClusterState.FAILED.value, ClusterState.TERMINATED.value])))
        for cloud, zone, instance_type, state, reason, ended, spot in rows:
            if ended is None or not spot:
                continue
            key = f"{cloud}/{zone}/{instance_type}"
            if state == ClusterState.FAILED.value:
                failed.setdefault(key, []).append(ended)
            elif reason and "reclaimed" in reason:
                preempted.setdefault(key, []).append(ended)
        keys = set(preempted) | set(failed)
        return {k: ZoneRecord(tuple(sorted(preempted.get(k, []))), tuple(sorted(failed.get(k, [])))) for k in keys}

    def _avoid(self, s: Session, job: JobRow) -> set[str]:
        """Spot zones this job was preempted from or refused by recently."""
        since = self.clock.now() - AVOID_ZONE_FOR
        rows = s.execute(select(ClusterRow.cloud, ClusterRow.zone, ClusterRow.instance_type)
                         .where(ClusterRow.job_id == job.id, ClusterRow.spot.is_(True),
                                ClusterRow.terminated_at.is_not(None), ClusterRow.terminated_at >= since))
        avoid = {f"{c}/{z}/{i}" for c, z, i in rows}
        notices = s.execute(select(ClusterRow.cloud, ClusterRow.zone, ClusterRow.instance_type)
                            .join(NoticeRow, NoticeRow.cluster_id == ClusterRow.id)
                            .where(ClusterRow.job_id == job.id))
        avoid |= {f"{c}/{z}/{i}" for c, z, i in notices}
        return avoid

    def _progress_s(self, s: Session, job: JobRow) -> float:
        """Work done and kept: running time of every attempt, less what was lost to preemptions."""
        done = 0.0
        for alloc in s.scalars(select(AllocationRow).where(AllocationRow.job_id == job.id)):
            start = alloc.running_at or alloc.started_at
            end = alloc.ended_at or self.clock.now()
            done += max((end - start).total_seconds(), 0.0)
        return max(done - job.work_lost_s, 0.0)

    # ----------------------------------------------------------------- the state machine

    def _current_allocation(self, s: Session, job: JobRow) -> AllocationRow | None:
        if job.attempt == 0:
            return None
        return s.scalar(select(AllocationRow).where(AllocationRow.job_id == job.id,
                                                    AllocationRow.attempt == job.attempt))

    def _target_cluster(self, s: Session, job: JobRow) -> ClusterRow | None:
        if job.target_cluster_id is None:
            return None
        row = s.get(ClusterRow, job.target_cluster_id)
        if row is None or row.state not in (ClusterState.PROVISIONING.value, ClusterState.UP.value):
            return None
        return row

    def _from_pending(self, s: Session, job: JobRow, after: _AfterCommit) -> None:
        if self._place_on_existing(s, job):
            return
        exclude = self._avoid(s, job)
        row = self._launch(s, job, self._plan(s, job, Location(IDLE), exclude), exclude, after)
        if row is not None:
            if job.started_at is None:
                job.started_at = self.clock.now()
            self._transition(s, job, JobState.PROVISIONING, cluster=row.id, zone=row.zone)
            return
        self._preempt_for(s, job, after)

    def _place_on_existing(self, s: Session, job: JobRow) -> bool:
        """Claim free GPUs on a cluster that is already up, cheapest per GPU first."""
        spec = self.spec_of(job)
        clusters = s.scalars(select(ClusterRow).where(ClusterRow.state == ClusterState.UP.value))
        for row in sorted(clusters, key=lambda r: (r.price_per_node_hour / max(r.gpus_per_node, 1), r.id)):
            per_node = packing.hosts(row, spec, job)
            if per_node is None or self._open_notice(s, row.id, any_state=True) is not None:
                continue
            placement = self.placement(packing.gang_request(job, self.spec_of(job), per_node), packing.snapshot(s, row))
            if placement is None:
                continue
            job.target_cluster_id, job.target_gpus = row.id, placement.to_json()
            if job.started_at is None:
                job.started_at = self.clock.now()
            self._transition(s, job, JobState.PROVISIONING, cluster=row.id, zone=row.zone,
                             reason="placed on free GPUs of a running cluster")
            return True
        return False

    def _preempt_for(self, s: Session, job: JobRow, after: _AfterCommit) -> None:
        """Take GPUs from lower-priority gangs when the work they lose is less than this job gains."""
        spec = self.spec_of(job)
        now = self.clock.now()
        for row in s.scalars(select(ClusterRow).where(ClusterRow.state == ClusterState.UP.value)):
            per_node = packing.hosts(row, spec, job)
            if per_node is None:
                continue
            running = packing.running_gangs(s, row.id, now, self.options.restart_overhead_s)
            request = PreemptionRequest(packing.gang_request(job, self.spec_of(job), per_node), job.priority,
                                        self._wait_avoided(s, running))
            plan = self.preemption(request, packing.snapshot(s, row), running)
            if plan is None:
                continue
            for victim_id in plan.victims:
                victim = s.get(JobRow, victim_id, with_for_update=True)
                assert victim is not None
                victim.preempted_by = job.id
                victim.checkpoint_requested_at = now
                victim_alloc = self._current_allocation(s, victim)
                if victim_alloc is not None:
                    victim_alloc.stopping_at = now
                self._transition(s, victim, JobState.CHECKPOINTING, reason=f"preempted by {job.id}",
                                 cluster=row.id)
                signal = self.spec_of(victim).broker.checkpoint.signal
                after.signals.append((cluster_info(row), victim.id, victim.attempt, signal))
            job.target_cluster_id, job.target_gpus = row.id, plan.placement.to_json()
            self._transition(s, job, JobState.PROVISIONING, cluster=row.id, preempting=list(plan.victims),
                             work_lost_gpu_s=plan.work_lost_gpu_s, gain_gpu_s=plan.gain_gpu_s)
            return

    def _wait_avoided(self, s: Session, running: tuple[packing.RunningGang, ...]) -> float:
        """How long the job would otherwise wait: until the first running gang is due to finish."""
        remaining = []
        for gang in running:
            other = s.get(JobRow, gang.job_id)
            if other is None or other.work_s is None:
                return math.inf
            remaining.append(max(other.work_s - self._progress_s(s, other), 0.0))
        return min(remaining) if remaining else 0.0

    def _from_provisioning(self, s: Session, job: JobRow, after: _AfterCommit) -> None:
        if self._target_cluster(s, job) is not None:
            return  # coming up, or up: _start_if_ready runs after this transaction
        job.target_cluster_id = job.target_gpus = None
        previous = self._current_allocation(s, job)
        leaving = previous.cluster_id if previous is not None and previous.ended_at is None else None
        exclude = self._avoid(s, job)
        plan = self._plan(s, job, Location(IDLE), exclude)
        row = self._launch(s, job, plan, exclude, after, leaving=leaving)
        if row is None and JobState(job.state) is JobState.PROVISIONING:
            self._transition(s, job, JobState.PENDING, reason="no offer could be launched; waiting")

    def _from_running(self, s: Session, job: JobRow, after: _AfterCommit) -> None:
        alloc = self._current_allocation(s, job)
        if alloc is None:
            return
        cluster = s.get(ClusterRow, alloc.cluster_id)
        assert cluster is not None
        notice = self._open_notice(s, cluster.id)
        if notice is not None:
            notice.handled_at = self.clock.now()
            alloc.stopping_at = notice.received_at
            job.preemptions += 1
            self._record_checkpoint(job, notice)
            self._transition(s, job, JobState.CHECKPOINTING, cluster=cluster.id, zone=cluster.zone,
                             notice=notice.kind, action_time=notice.action_time)
            self._launch_replacement(s, job, cluster, after)
            return
        run = self.provisioner.run_status(cluster_info(cluster), job.id, job.attempt)
        if run.phase is RunPhase.SUCCEEDED:
            self._end_allocation(alloc, "succeeded")
            job.exit_code = 0
            self._transition(s, job, JobState.SUCCEEDED)
        elif run.phase is RunPhase.FAILED:
            self._end_allocation(alloc, "failed")
            job.exit_code = run.exit_code
            job.reason = f"the job exited with code {run.exit_code}"
            self._transition(s, job, JobState.FAILED, exit_code=run.exit_code)
        elif run.phase is RunPhase.LOST:
            # The nodes vanished without a notice (or before one was heard): recover from the checkpoint.
            job.preemptions += 1
            self._transition(s, job, JobState.MIGRATING, cluster=cluster.id, reason="nodes lost without notice")
            self._launch_replacement(s, job, cluster, after)
        elif run.phase is RunPhase.NOT_STARTED:
            # Recorded as started, never started: the engine stopped between the two. Starting is idempotent.
            after.starts.append(self._job_launch(job, cluster, GangPlacement.from_json(cluster.id, alloc.gpus)))
        else:
            self._review(s, job, alloc, cluster, after)

    def _review(self, s: Session, job: JobRow, alloc: AllocationRow, cluster: ClusterRow,
                after: _AfterCommit) -> None:
        """Once per market tick, ask the policy whether the running job should move, as the simulator does.

        A move brings the new cluster up first while the job keeps running where it is; only once
        the new nodes are up is the job told to checkpoint, so it loses almost no work.
        """
        target = self._target_cluster(s, job)
        if target is not None:
            if target.state == ClusterState.UP.value:
                now = self.clock.now()
                job.checkpoint_requested_at = alloc.stopping_at = now
                self._transition(s, job, JobState.CHECKPOINTING, cluster=cluster.id, to=target.zone,
                                 reason="moving: the new nodes are up")
                signal = self.spec_of(job).broker.checkpoint.signal
                after.signals.append((cluster_info(cluster), job.id, job.attempt, signal))
            return
        job.target_cluster_id = job.target_gpus = None  # a move whose launch failed: stay
        tick = int(self.clock.now().timestamp() // self._review_seconds())
        if self._asked.get(job.id) == tick or cluster.job_id != job.id:
            return  # reviewed this tick already; a gang placed on a shared cluster stays put
        self._asked[job.id] = tick
        here = self._location_of(s, cluster)
        plan = self._plan(s, job, here, set())
        if not plan.locations or _same_place(plan.locations[0], here):
            return
        destination = plan.locations[0]
        if self._launch(s, job, Plan((destination,), plan.reason), set(), after, leaving=cluster.id) is not None:
            self._event(s, job.id, "moving", to=destination.label, reason=plan.reason)

    def _review_seconds(self) -> float:
        trace = getattr(self.market, "trace", None)
        return float(trace.tick_seconds) if trace is not None else 300.0

    def _location_of(self, s: Session, cluster: ClusterRow) -> Location:
        if not cluster.spot:
            return Location(ON_DEMAND)
        quote = self.market.quote(OfferKey(cluster.cloud, cluster.region, cluster.zone, cluster.instance_type),
                                  self.clock.now())
        return Location("spot", ZoneOffer(
            quote.cloud, quote.region, quote.zone, quote.instance_type, quote.accelerator, quote.gpus_per_node,
            float(quote.spot_price or math.inf), float(quote.on_demand_price or math.inf), quote.available_nodes,
            quote.capacity_score))

    def _launch_replacement(self, s: Session, job: JobRow, cluster: ClusterRow, after: _AfterCommit) -> None:
        exclude = self._avoid(s, job)
        if cluster.spot:  # never straight back into the zone that just took the nodes away
            exclude.add(f"{cluster.cloud}/{cluster.zone}/{cluster.instance_type}")
        self._launch(s, job, self._plan(s, job, self._location_of(s, cluster), exclude), exclude, after,
                     leaving=cluster.id)

    def _from_checkpointing(self, s: Session, job: JobRow, after: _AfterCommit) -> None:
        alloc = self._current_allocation(s, job)
        assert alloc is not None
        cluster = s.get(ClusterRow, alloc.cluster_id)
        assert cluster is not None
        run = self.provisioner.run_status(cluster_info(cluster), job.id, job.attempt)
        if run.phase is RunPhase.SUCCEEDED:
            # It finished inside its notice period: nothing to move.
            self._end_allocation(alloc, "succeeded")
            job.exit_code = 0
            job.preempted_by = None
            self._transition(s, job, JobState.SUCCEEDED)
            return
        if job.preempted_by is not None:
            self._yield_gpus(s, job, alloc, cluster, after)
            return
        if job.checkpoint_requested_at is not None and self._open_notice(s, cluster.id, any_state=True) is None:
            # A move the policy chose: go once the job has checkpointed, or its grace ran out.
            if self._checkpointed_since(job, job.checkpoint_requested_at):
                self._transition(s, job, JobState.MIGRATING, reason="checkpoint complete")
            return
        notice = s.scalar(select(NoticeRow).where(NoticeRow.cluster_id == cluster.id,
                                                  NoticeRow.kind.in_(TERMINATE_KINDS)))
        if notice is not None:
            self._record_checkpoint(job, notice)
        now = self.clock.now()
        checkpointed = notice is not None and notice.checkpoint is not None
        deadline_passed = notice is not None and notice.action_time is not None and now >= notice.action_time
        gone = cluster.state not in (ClusterState.UP.value, ClusterState.PROVISIONING.value)
        if checkpointed or deadline_passed or gone:
            self._transition(s, job, JobState.MIGRATING, checkpoint=job.checkpoint,
                             reason="checkpoint complete" if checkpointed else "notice deadline reached")

    def _yield_gpus(self, s: Session, job: JobRow, alloc: AllocationRow, cluster: ClusterRow,
                    after: _AfterCommit) -> None:
        """A gang preempted inside its cluster: once it has checkpointed (or its grace ran out), stop and requeue."""
        if not self._checkpointed_since(job, job.checkpoint_requested_at or self.clock.now()):
            return
        after.stops.append((cluster_info(cluster), job.id, job.attempt))
        self._refresh_checkpoint(s, job, cluster)
        self._close_attempt(job, alloc, self.clock.now())
        job.preemptions += 1
        job.preempted_by = job.checkpoint_requested_at = None
        self._transition(s, job, JobState.PENDING, reason="requeued after yielding its GPUs",
                         checkpoint=job.checkpoint)

    def _checkpointed_since(self, job: JobRow, requested: datetime) -> bool:
        """The job marked a checkpoint complete after ``requested``, or its grace to do so ran out."""
        mark = latest_checkpoint(job.checkpoint_dir)
        if mark is not None and self.clock.to_clock(mark.written_at) >= requested:
            return True
        return self.clock.now() >= requested + self.spec_of(job).broker.checkpoint.grace

    def _refresh_checkpoint(self, s: Session, job: JobRow, cluster: ClusterRow) -> None:
        """The newest complete checkpoint: the last one reported on a notice, or the marker itself."""
        for notice in s.scalars(select(NoticeRow).where(NoticeRow.cluster_id == cluster.id)):
            self._record_checkpoint(job, notice)
        mark = latest_checkpoint(job.checkpoint_dir)
        if mark is not None:
            written = self.clock.to_clock(mark.written_at)
            if job.checkpoint_at is None or written > job.checkpoint_at:
                job.checkpoint, job.checkpoint_at = mark.path, written

    def _record_checkpoint(self, job: JobRow, notice: NoticeRow) -> None:
        if notice.checkpoint and notice.checkpoint != job.checkpoint:
            at = notice.detail.get("checkpoint_at") if notice.detail else None
            when = self.clock.to_clock(datetime.fromisoformat(at).timestamp()) if at else self.clock.now()
            if job.checkpoint_at is None or when >= job.checkpoint_at:
                job.checkpoint, job.checkpoint_at = notice.checkpoint, when

    def _open_notice(self, s: Session, cluster_id: str, any_state: bool = False) -> NoticeRow | None:
        query = select(NoticeRow).where(NoticeRow.cluster_id == cluster_id, NoticeRow.kind.in_(TERMINATE_KINDS))
        if not any_state:
            query = query.where(NoticeRow.handled_at.is_(None))
        return s.scalar(query)

    def _end_allocation(self, alloc: AllocationRow, outcome: str, at: datetime | None = None) -> None:
        if alloc.ended_at is None:
            alloc.ended_at = at or self.clock.now()
            alloc.outcome = outcome

    def _close_attempt(self, job: JobRow, alloc: AllocationRow, stopped: datetime) -> None:
        """End an attempt cut short and count the work done since its last checkpoint as lost."""
        self._end_allocation(alloc, "preempted", stopped)
        began = alloc.running_at or alloc.started_at
        kept_until = job.checkpoint_at if job.checkpoint_at and job.checkpoint_at > began else began
        job.work_lost_s += max((stopped - kept_until).total_seconds(), 0.0)

    def _start_if_ready(self, job_id: str) -> None:
        """Start the job on its target once the GPUs are up and free (and any old cluster is gone)."""
        after = _AfterCommit.empty()
        with self.store.transaction() as s:
            job = s.get(JobRow, job_id, with_for_update=True)
            if job is None or job.state not in (JobState.PROVISIONING.value, JobState.MIGRATING.value):
                return
            target = self._target_cluster(s, job)
            if target is None or target.state != ClusterState.UP.value or job.target_gpus is None:
                return
            claim = GangPlacement.from_json(target.id, job.target_gpus)
            held = packing.holdings(s, target.id)
            if any(other != job.id and _overlaps(claim, placement) for other, placement in held.items()):
                return  # the gangs it preempted have not left yet
            previous = self._current_allocation(s, job)
            if previous is not None and previous.ended_at is None:
                old = s.get(ClusterRow, previous.cluster_id)
                assert old is not None
                if old.state in (ClusterState.UP.value, ClusterState.PROVISIONING.value,
                                 ClusterState.TERMINATING.value):
                    # Release the old nodes first: two copies of a job must never share a checkpoint dir.
                    if old.state != ClusterState.TERMINATING.value:
                        old.state = ClusterState.TERMINATING.value
                        old.terminate_at = self.clock.now()
                    after.terminations.append(cluster_info(old))
                else:
                    self._refresh_checkpoint(s, job, old)
                    self._close_attempt(job, previous, min(old.terminated_at or self.clock.now(), self.clock.now()))
                    job.migrations += 1
                    after.starts.append(self._start_on(s, job, target, claim))
            else:
                after.starts.append(self._start_on(s, job, target, claim))
        self._carry_out(after)

    def _start_on(self, s: Session, job: JobRow, target: ClusterRow,
                  placement: GangPlacement) -> tuple[ClusterInfo, JobLaunch]:
        job.attempt += 1
        now = self.clock.now()
        s.add(AllocationRow(job_id=job.id, cluster_id=target.id, attempt=job.attempt, gpus=placement.to_json(),
                            started_at=now, running_at=now))
        job.target_cluster_id = job.target_gpus = job.checkpoint_requested_at = None
        job.zones = [*job.zones, target.zone]
        self._transition(s, job, JobState.RUNNING, cluster=target.id, zone=target.zone,
                         gpus=placement.to_json(), resume_from=job.checkpoint, attempt=job.attempt)
        return self._job_launch(job, target, placement)

    def _job_launch(self, job: JobRow, target: ClusterRow, placement: GangPlacement) -> tuple[ClusterInfo, JobLaunch]:
        return cluster_info(target, self.tokens(target.id)), JobLaunch(
            job_id=job.id, attempt=job.attempt, spec=self.spec_of(job), placement=placement,
            checkpoint_dir=job.checkpoint_dir, resume_from=job.checkpoint,
            broker_url=self.options.broker_url, log_dir=str(self.options.home / "logs" / job.id),
        )

    # ----------------------------------------------------------------- teardown and ledger

    def _reap(self) -> None:
        """Tear down every live cluster that no active job holds or is heading to."""
        after = _AfterCommit.empty()
        with self.store.transaction() as s:
            for row in s.scalars(select(ClusterRow).where(ClusterRow.state.in_(
                    [ClusterState.PROVISIONING.value, ClusterState.UP.value]))):
                for alloc in s.scalars(select(AllocationRow).where(AllocationRow.cluster_id == row.id,
                                                                   AllocationRow.ended_at.is_(None))):
                    holder = s.get(JobRow, alloc.job_id)
                    if holder is None or JobState(holder.state).terminal:
                        self._end_allocation(alloc, holder.state.lower() if holder else "orphaned")
                if not packing.holdings(s, row.id):
                    row.state = ClusterState.TERMINATING.value
                    row.terminate_at = self.clock.now()
            for row in s.scalars(select(ClusterRow).where(ClusterRow.state == ClusterState.TERMINATING.value)):
                after.terminations.append(cluster_info(row))
                for alloc in s.scalars(select(AllocationRow).where(AllocationRow.cluster_id == row.id,
                                                                   AllocationRow.ended_at.is_(None))):
                    holder = s.get(JobRow, alloc.job_id)
                    if holder is not None and holder.state == JobState.RUNNING.value:
                        after.stops.append((cluster_info(row), holder.id, holder.attempt))
        self._carry_out(after)

    def _meter(self) -> None:
        now = self.clock.now()
        with self.store.transaction() as s:
            ids = list(s.scalars(select(ClusterRow.id).where(ClusterRow.up_at.is_not(None))
                                 .where((ClusterRow.metered_until.is_(None))
                                        | (ClusterRow.terminated_at.is_(None))
                                        | (ClusterRow.metered_until < ClusterRow.terminated_at))))
        for cluster_id in ids:
            with self.store.transaction() as s:
                row = s.get(ClusterRow, cluster_id, with_for_update=True)
                if row is not None:
                    meter_cluster(s, row, now, self.market)


def _same_place(target: Location, here: Location) -> bool:
    if target.kind != here.kind:
        return False
    if target.kind != "spot":
        return True
    return target.offer is not None and here.offer is not None and target.offer.location == here.offer.location


def _overlaps(a: GangPlacement, b: GangPlacement) -> bool:
    mine = {(rank, gpu) for rank, gpus in a.gpus for gpu in gpus}
    return any((rank, gpu) in mine for rank, gpus in b.gpus for gpu in gpus)


def _fits(spec: JobSpec, quote: SpotQuote, exact: bool = False) -> bool:
    if not spec.accelerators:
        return True
    return any(a.name.lower() == quote.accelerator.lower()
               and (a.count == quote.gpus_per_node if exact else a.count <= quote.gpus_per_node)
               for a in spec.accelerators)


def _wall_now() -> datetime:
    return datetime.now(UTC)


def _jsonable(detail: dict[str, object]) -> dict[str, object]:
    return {k: (v.isoformat() if isinstance(v, datetime) else v) for k, v in detail.items() if v is not None}
def cancel_job(store: Store, job_id: str) -> str:
    """Mark a job cancelled in one transaction; the engine tears its clusters down on its next step."""
    from datetime import UTC

    with store.transaction() as s:
        job = s.get(JobRow, job_id, with_for_update=True)
        if job is None:
            raise UnknownJob(f"no job {job_id!r}")
        current = JobState(job.state)
        if current.terminal:
            return current.value
        now = datetime.now(UTC)
        job.state = JobState.CANCELLED.value
        job.updated_at = job.finished_at = job.wall_finished_at = now
        s.add(JobEventRow(job_id=job.id, at=now, kind="transition", from_state=current.value,
                          to_state=JobState.CANCELLED.value, detail={"reason": "cancelled by user"}))
        return JobState.CANCELLED.value


def submit_job(store: Store, clock: Clock, spec: JobSpec, home: Path, backend: str) -> str:
    """Record a validated job as PENDING, in one transaction; the engine takes it from there."""
    now = clock.now()
    job_id = f"j-{secrets.token_hex(4)}"
    checkpoint_dir = spec.broker.checkpoint.dir or str(home / "checkpoints" / job_id)
    with store.transaction() as s:
        s.add(JobRow(
            id=job_id, name=spec.name, team=spec.broker.team, state=JobState.PENDING.value,
            priority=spec.broker.priority, spec=spec.to_data(),
            spec_path=str(Path(spec.source).resolve()) if spec.source else None,
            backend=backend, num_nodes=spec.num_nodes, gpus_per_node=spec.gpus_per_node,
            accelerator=spec.accelerator, deadline=spec.broker.deadline_at(now),
            work_s=spec.broker.work.total_seconds() if spec.broker.work else None,
            checkpoint_dir=checkpoint_dir, attempt=0, preemptions=0, migrations=0, work_lost_s=0.0,
            zones=[], created_at=now, updated_at=now, wall_started_at=_wall_now(),
        ))
        s.flush()
        s.add(JobEventRow(job_id=job_id, at=now, kind="submitted", to_state=JobState.PENDING.value,
                          detail={"name": spec.name}))
    return job_id
