"""The engine: the job state machine, driven one idempotent step at a time.

Each ``step()`` reads the store, asks the provisioner where things stand, and moves every job
on by at most one transition, each in its own transaction. Nothing is kept in memory that the
store does not also hold (the parsed-spec cache is only a cache), so an engine started after a
crash picks up exactly where the last one stopped: a cluster row is written before its launch is
asked for, and launches and job starts are idempotent in the provisioner.
"""

from __future__ import annotations

import hashlib
import logging
import math
import secrets
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path
from typing import Protocol

from sqlalchemy import select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from broker.agent.checkpoint import latest_checkpoint
from broker.clock import Clock
from broker.model import ClusterState, GangPlacement, JobState, Usage, check_transition
from broker.provision.base import ClusterInfo, ClusterPhase, JobLaunch, Provisioner, RunPhase
from broker.spec import JobSpec, job_spec_from_data
from broker.store import Store
from broker.store.tables import AllocationRow, ClusterRow, JobEventRow, JobRow, LedgerRow, NoticeRow
from policies import registry
from policies.selection import IDLE, ON_DEMAND, JobView, Location, Plan, SelectionRequest, ZoneOffer, ZoneRecord
from providers.base import OfferKey, SpotQuote

log = logging.getLogger("broker.engine")

ACTIVE_STATES = [s.value for s in JobState if not s.terminal]
LIVE_CLUSTER_STATES = [s.value for s in ClusterState if s.live]
# How long a zone that preempted or refused a job stays off that job's plans.
AVOID_ZONE_FOR = timedelta(hours=1)
TERMINATE_KINDS = frozenset({"terminate", "stop", "hibernate", "maintenance"})


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
    broker_url: str | None = None
    restart_overhead_s: float = 720.0
    # A gate a PENDING job must pass before it is planned (the service's capacity shares); None: all pass.
    admit: Callable[[Session, JobRow], bool] | None = None


class Engine:
    def __init__(self, store: Store, clock: Clock, market: MarketView, provisioner: Provisioner,
                 options: EngineOptions, tokens: Callable[[str], str]) -> None:
        self.store = store
        self.clock = clock
        self.market = market
        self.provisioner = provisioner
        self.options = options
        self.policy = registry.get("selection", options.selection_policy)
        self._specs: dict[str, JobSpec] = {}
        # cluster id -> the token its agents authenticate with; the store keeps only hashes.
        self.tokens = tokens
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
            with self.store.transaction() as s:
                job_ids = list(s.scalars(select(JobRow.id).where(JobRow.state.in_(ACTIVE_STATES))
                                         .order_by(JobRow.priority.desc(), JobRow.created_at)))
            for job_id in job_ids:
                self._advance(job_id)
            self._reap()
            self._meter()

    def active_jobs(self) -> list[str]:
        with self.store.transaction() as s:
            return list(s.scalars(select(JobRow.id).where(JobRow.state.in_(ACTIVE_STATES))))

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

    def _launch(self, s: Session, job: JobRow, plan: Plan, exclude: set[str]) -> ClusterRow | None:
        """Write the cluster row for the plan's first usable location; launched after commit."""
        for location in plan.locations:
            if location.offer is None or location.kind == IDLE:
                continue
            offer = location.offer
            spot = location.kind != ON_DEMAND
            if spot and offer.location in exclude:
                continue
            sequence = len(list(s.scalars(select(ClusterRow.id).where(ClusterRow.job_id == job.id)))) + 1
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
            self._event(s, job.id, "launch", cluster=row.id, zone=offer.zone, cloud=offer.cloud,
                        spot=spot, price=row.price_per_node_hour, reason=plan.reason)
            return row
        return None

    def _after_commit_launch(self, row: ClusterRow | None) -> None:
        if row is not None:
            self.provisioner.launch(cluster_info(row, self.tokens(row.id)))

    # ----------------------------------------------------------------- planning

    def _plan(self, s: Session, job: JobRow, current: Location, exclude: set[str]) -> Plan:
        spec = self.spec_of(job)
        now = self.clock.now()
        quotes = self.market.quotes(now)
        offers = tuple(
            ZoneOffer(q.cloud, q.region, q.zone, q.instance_type, q.accelerator, q.gpus_per_node,
                      float(q.spot_price or math.inf), float(q.on_demand_price or math.inf),
                      q.available_nodes, q.capacity_score)
            for q in quotes
            if q.spot_price is not None and q.on_demand_price is not None and _fits(spec, q)
        )
        remaining = None
        if job.work_s is not None:
            remaining = max(job.work_s - self._progress_s(s, job), 0.0)
        request = SelectionRequest(
            now=now,
            job=JobView(
                num_nodes=job.num_nodes, gpus_per_node=job.gpus_per_node, accelerator=job.accelerator,
                remaining_work_s=remaining, deadline=job.deadline,
                restart_overhead_s=self.options.restart_overhead_s,
                max_price_per_hour=spec.broker.max_price,
                allowed_clouds=frozenset(c.cloud for c in spec.broker.clouds),
            ),
            offers=offers,
            current=current,
            record=self._zone_records(s),
            excluded=frozenset(exclude),
        )
        return self.policy(request)  # type: ignore[no-any-return]

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
        """Work done and kept: running time of every attempt up to its last checkpoint, plus the live one."""
        done = 0.0
        for alloc in s.scalars(select(AllocationRow).where(AllocationRow.job_id == job.id)):
            start = alloc.running_at or alloc.started_at
            end = alloc.ended_at or self.clock.now()
            done += max((end - start).total_seconds(), 0.0)
        return max(done - job.work_lost_s, 0.0)

    # ----------------------------------------------------------------- the state machine

    def _advance(self, job_id: str) -> None:
        launched: ClusterRow | None = None
        with self.store.transaction() as s:
            job = s.get(JobRow, job_id, with_for_update=True)
            if job is None or JobState(job.state).terminal:
                return
            state = JobState(job.state)
            if state is JobState.PENDING:
                if self.options.admit is not None and not self.options.admit(s, job):
                    return
                launched = self._from_pending(s, job)
            elif state in (JobState.PROVISIONING, JobState.MIGRATING):
                launched = self._from_provisioning(s, job)
            elif state is JobState.RUNNING:
                launched = self._from_running(s, job)
            elif state is JobState.CHECKPOINTING:
                self._from_checkpointing(s, job)
        self._after_commit_launch(launched)
        if launched is None:
            self._start_if_ready(job_id)

    def _transition(self, s: Session, job: JobRow, target: JobState, **detail: object) -> None:
        current = JobState(job.state)
        check_transition(current, target)
        now = self.clock.now()
        job.state = target.value
        job.updated_at = now
        if target.terminal:
            job.finished_at = now
        s.add(JobEventRow(job_id=job.id, at=now, kind="transition", from_state=current.value,
                          to_state=target.value, detail=_jsonable(detail)))
        log.info("job %s: %s -> %s %s", job.id, current, target, detail or "")

    def _event(self, s: Session, job_id: str | None, kind: str, **detail: object) -> None:
        if job_id is not None:
            s.add(JobEventRow(job_id=job_id, at=self.clock.now(), kind=kind, detail=_jsonable(detail)))

    def _current_allocation(self, s: Session, job: JobRow) -> AllocationRow | None:
        if job.attempt == 0:
            return None
        return s.scalar(select(AllocationRow).where(AllocationRow.job_id == job.id,
                                                    AllocationRow.attempt == job.attempt))

    def _target_cluster(self, s: Session, job: JobRow) -> ClusterRow | None:
        """The newest cluster launched for the job that is not its current one and not failed."""
        alloc = self._current_allocation(s, job)
        rows = s.scalars(select(ClusterRow).where(ClusterRow.job_id == job.id)
                         .order_by(ClusterRow.created_at.desc(), ClusterRow.id.desc()))
        for row in rows:
            if alloc is not None and row.id == alloc.cluster_id:
                return None
            if row.state in (ClusterState.PROVISIONING.value, ClusterState.UP.value):
                return row
            return None
        return None

    def _from_pending(self, s: Session, job: JobRow) -> ClusterRow | None:
        exclude = self._avoid(s, job)
        plan = self._plan(s, job, Location(IDLE), exclude)
        row = self._launch(s, job, plan, exclude)
        if row is None:
            return None
        if job.started_at is None:
            job.started_at = self.clock.now()
        self._transition(s, job, JobState.PROVISIONING, cluster=row.id, zone=row.zone)
        return row

    def _from_provisioning(self, s: Session, job: JobRow) -> ClusterRow | None:
        target = self._target_cluster(s, job)
        if target is not None:
            return None  # still coming up (or up: _start_if_ready runs after this transaction)
        exclude = self._avoid(s, job)
        plan = self._plan(s, job, Location(IDLE), exclude)
        row = self._launch(s, job, plan, exclude)
        if row is None and JobState(job.state) is JobState.PROVISIONING:
            self._transition(s, job, JobState.PENDING, reason="no offer could be launched; waiting")
        return row

    def _from_running(self, s: Session, job: JobRow) -> ClusterRow | None:
        alloc = self._current_allocation(s, job)
        if alloc is None:
            return None
        cluster = s.get(ClusterRow, alloc.cluster_id)
        assert cluster is not None
        notice = self._open_notice(s, cluster.id)
        if notice is not None:
            notice.handled_at = self.clock.now()
            job.preemptions += 1
            self._record_checkpoint(job, notice)
            self._transition(s, job, JobState.CHECKPOINTING, cluster=cluster.id, zone=cluster.zone,
                             notice=notice.kind, action_time=notice.action_time)
            return self._launch_replacement(s, job)
        run = self.provisioner.run_status(cluster_info(cluster), job.id, job.attempt)
        if run.phase is RunPhase.SUCCEEDED:
            self._end_allocation(alloc, "succeeded")
            job.exit_code = 0
            job.wall_finished_at = _wall_now()
            self._transition(s, job, JobState.SUCCEEDED)
        elif run.phase is RunPhase.FAILED:
            self._end_allocation(alloc, "failed")
            job.exit_code = run.exit_code
            job.reason = f"the job exited with code {run.exit_code}"
            job.wall_finished_at = _wall_now()
            self._transition(s, job, JobState.FAILED, exit_code=run.exit_code)
        elif run.phase is RunPhase.LOST:
            # The nodes vanished without a notice (or before one was heard): recover from the checkpoint.
            job.preemptions += 1
            self._transition(s, job, JobState.MIGRATING, cluster=cluster.id, reason="nodes lost without notice")
            return self._launch_replacement(s, job)
        return None

    def _launch_replacement(self, s: Session, job: JobRow) -> ClusterRow | None:
        alloc = self._current_allocation(s, job)
        cluster = s.get(ClusterRow, alloc.cluster_id) if alloc else None
        current = Location("spot" if cluster is not None and cluster.spot else ON_DEMAND)
        exclude = self._avoid(s, job)
        plan = self._plan(s, job, current, exclude)
        return self._launch(s, job, plan, exclude)

    def _from_checkpointing(self, s: Session, job: JobRow) -> None:
        alloc = self._current_allocation(s, job)
        assert alloc is not None
        cluster = s.get(ClusterRow, alloc.cluster_id)
        assert cluster is not None
        notice = s.scalar(select(NoticeRow).where(NoticeRow.cluster_id == cluster.id,
                                                  NoticeRow.kind.in_(TERMINATE_KINDS)))
        now = self.clock.now()
        if notice is not None:
            self._record_checkpoint(job, notice)
        run = self.provisioner.run_status(cluster_info(cluster), job.id, job.attempt)
        if run.phase is RunPhase.SUCCEEDED:
            # It finished inside its notice period: nothing to migrate.
            self._end_allocation(alloc, "succeeded")
            job.exit_code = 0
            job.wall_finished_at = _wall_now()
            self._transition(s, job, JobState.SUCCEEDED)
            return
        checkpointed = notice is not None and notice.checkpoint is not None
        deadline_passed = notice is not None and notice.action_time is not None and now >= notice.action_time
        gone = cluster.state not in (ClusterState.UP.value, ClusterState.PROVISIONING.value)
        if checkpointed or deadline_passed or gone:
            self._transition(s, job, JobState.MIGRATING, checkpoint=job.checkpoint,
                             reason="checkpoint complete" if checkpointed else "notice deadline reached")

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
            job.checkpoint = notice.checkpoint
            at = notice.detail.get("checkpoint_at") if notice.detail else None
            job.checkpoint_at = self.clock.to_clock(datetime.fromisoformat(at).timestamp()) if at else \
                self.clock.now()

    def _open_notice(self, s: Session, cluster_id: str) -> NoticeRow | None:
        return s.scalar(select(NoticeRow).where(NoticeRow.cluster_id == cluster_id, NoticeRow.handled_at.is_(None),
                                                NoticeRow.kind.in_(TERMINATE_KINDS)))

    def _end_allocation(self, alloc: AllocationRow, outcome: str, at: datetime | None = None) -> None:
        if alloc.ended_at is None:
            alloc.ended_at = at or self.clock.now()
            alloc.outcome = outcome

    def _start_if_ready(self, job_id: str) -> None:
        """Start the job on its target cluster once that cluster is up and the old one is gone."""
        launch: tuple[ClusterInfo, JobLaunch] | None = None
        release: ClusterInfo | None = None
        with self.store.transaction() as s:
            job = s.get(JobRow, job_id, with_for_update=True)
            if job is None or job.state not in (JobState.PROVISIONING.value, JobState.MIGRATING.value):
                return
            target = self._target_cluster(s, job)
            if target is None or target.state != ClusterState.UP.value:
                return
            previous = self._current_allocation(s, job)
            old = s.get(ClusterRow, previous.cluster_id) if previous is not None else None
            if old is not None and old.state in (ClusterState.UP.value, ClusterState.PROVISIONING.value,
                                                 ClusterState.TERMINATING.value):
                # Release the old nodes first: two copies of a job must never share a checkpoint dir.
                if old.state != ClusterState.TERMINATING.value:
                    old.state = ClusterState.TERMINATING.value
                    old.terminate_at = self.clock.now()
                release = cluster_info(old)
            else:
                if previous is not None and old is not None:
                    self._close_previous(s, job, previous, old)
                launch = self._start_on(s, job, target)
        if release is not None:
            self.provisioner.terminate(release)
        if launch is not None:
            self.provisioner.start_job(*launch)

    def _close_previous(self, s: Session, job: JobRow, previous: AllocationRow, old: ClusterRow) -> None:
        """Account for the attempt that was cut short: its end, and the work since its last checkpoint."""
        now = self.clock.now()
        self._refresh_checkpoint(s, job, old)
        stopped = min(old.terminated_at or now, now)
        self._end_allocation(previous, "preempted", stopped)
        began = previous.running_at or previous.started_at
        kept_until = job.checkpoint_at if job.checkpoint_at and job.checkpoint_at > began else began
        job.work_lost_s += max((stopped - kept_until).total_seconds(), 0.0)
        job.migrations += 1

    def _start_on(self, s: Session, job: JobRow, target: ClusterRow) -> tuple[ClusterInfo, JobLaunch]:
        job.attempt += 1
        placement = GangPlacement.whole_nodes(target.id, target.num_nodes, target.gpus_per_node)
        s.add(AllocationRow(job_id=job.id, cluster_id=target.id, attempt=job.attempt, gpus=placement.to_json(),
                            started_at=self.clock.now(), running_at=self.clock.now()))
        job.zones = [*job.zones, target.zone]
        self._transition(s, job, JobState.RUNNING, cluster=target.id, zone=target.zone,
                         resume_from=job.checkpoint, attempt=job.attempt)
        return cluster_info(target, self.tokens(target.id)), JobLaunch(
            job_id=job.id, attempt=job.attempt, spec=self.spec_of(job), placement=placement,
            checkpoint_dir=job.checkpoint_dir, resume_from=job.checkpoint,
            broker_url=self.options.broker_url, log_dir=str(self.options.home / "logs" / job.id),
        )

    # ----------------------------------------------------------------- teardown and ledger

    def _reap(self) -> None:
        """Tear down every live cluster no active job needs any more."""
        to_terminate: list[ClusterInfo] = []
        with self.store.transaction() as s:
            rows = s.scalars(select(ClusterRow).where(ClusterRow.state.in_(
                [ClusterState.PROVISIONING.value, ClusterState.UP.value])))
            for row in rows:
                job = s.get(JobRow, row.job_id) if row.job_id else None
                if job is None or JobState(job.state).terminal:
                    alloc = s.scalar(select(AllocationRow).where(AllocationRow.cluster_id == row.id,
                                                                 AllocationRow.ended_at.is_(None)))
                    if alloc is not None:
                        self._end_allocation(alloc, job.state.lower() if job else "orphaned")
                    row.state = ClusterState.TERMINATING.value
                    row.terminate_at = self.clock.now()
                    to_terminate.append(cluster_info(row))
                elif row.state == ClusterState.UP.value and not self._needed(s, job, row):
                    row.state = ClusterState.TERMINATING.value
                    row.terminate_at = self.clock.now()
                    to_terminate.append(cluster_info(row))
            for row in s.scalars(select(ClusterRow).where(ClusterRow.state == ClusterState.TERMINATING.value)):
                to_terminate.append(cluster_info(row))
        for info in to_terminate:
            self.provisioner.terminate(info)

    def _needed(self, s: Session, job: JobRow, row: ClusterRow) -> bool:
        alloc = self._current_allocation(s, job)
        if alloc is not None and alloc.cluster_id == row.id:
            return True
        target = self._target_cluster(s, job)
        return target is not None and target.id == row.id

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
                    self._meter_cluster(s, row, now)

    def _meter_cluster(self, s: Session, row: ClusterRow, now: datetime) -> None:
        start = row.metered_until or row.created_at
        end = min(row.terminated_at, now) if row.terminated_at else now
        minute = start
        key = OfferKey(row.cloud, row.region, row.zone, row.instance_type)
        allocations = list(s.scalars(select(AllocationRow).where(AllocationRow.cluster_id == row.id)))
        notice_at = s.scalar(select(NoticeRow.received_at).where(NoticeRow.cluster_id == row.id,
                                                                 NoticeRow.kind.in_(TERMINATE_KINDS)))
        job = s.get(JobRow, row.job_id) if row.job_id else None
        migrated_in = job is not None and any(a.started_at < row.created_at for a in
                                              s.scalars(select(AllocationRow).where(AllocationRow.job_id == job.id)))
        while minute < end:
            boundary = _next_minute(minute)
            closing = min(boundary, end)
            if closing < boundary and row.terminated_at is None:
                break  # only whole minutes while the cluster lives; the last partial one when it ends
            seconds = (closing - minute).total_seconds()
            quote = self.market.quote(key, minute)
            price = (quote.spot_price if row.spot else quote.on_demand_price) or row.price_per_node_hour
            on_demand = quote.on_demand_price or row.on_demand_price_per_node_hour
            for holder, usage, team, job_id in self._holders(row, minute, allocations, notice_at, job, migrated_in):
                s.add(LedgerRow(
                    cluster_id=row.id, minute=minute, holder=holder, job_id=job_id, team=team, usage=usage.value,
                    cloud=row.cloud, region=row.region, zone=row.zone, instance_type=row.instance_type,
                    accelerator=row.accelerator, nodes=row.num_nodes, gpus=row.num_nodes * row.gpus_per_node,
                    spot=row.spot, price_per_node_hour=price, on_demand_price_per_node_hour=on_demand,
                    cost=price * row.num_nodes * seconds / 3600.0,
                    on_demand_cost=on_demand * row.num_nodes * seconds / 3600.0,
                ))
            minute = closing
        row.metered_until = minute

    def _holders(self, row: ClusterRow, minute: datetime, allocations: Iterable[AllocationRow],
                 notice_at: datetime | None, job: JobRow | None, migrated_in: bool
                 ) -> list[tuple[str, Usage, str | None, str | None]]:
        team = job.team if job else None
        job_id = job.id if job else None
        holder = f"job:{job_id}" if job_id else "idle:waiting"
        if row.up_at is not None and minute < row.up_at:
            return [(holder, Usage.RESTARTING if migrated_in else Usage.PROVISIONING, team, job_id)]
        for alloc in allocations:
            if alloc.started_at <= minute and (alloc.ended_at is None or minute < alloc.ended_at):
                if notice_at is not None and minute >= notice_at:
                    return [(f"job:{alloc.job_id}", Usage.RESTARTING, team, alloc.job_id)]
                return [(f"job:{alloc.job_id}", Usage.RUNNING, team, alloc.job_id)]
        ended = [a for a in allocations if a.ended_at is not None and a.ended_at <= minute]
        if ended:
            finished = job is not None and JobState(job.state).terminal and ended[-1].outcome != "preempted"
            return [(holder, Usage.FINISHED if finished else Usage.RESTARTING, team, job_id)]
        return [(holder, Usage.RESTARTING if migrated_in else Usage.PROVISIONING, team, job_id)]


def _fits(spec: JobSpec, quote: SpotQuote) -> bool:
    if not spec.accelerators:
        return True
    return any(a.name.lower() == quote.accelerator.lower() and a.count == quote.gpus_per_node
               for a in spec.accelerators)


def _next_minute(when: datetime) -> datetime:
    return when.replace(second=0, microsecond=0) + timedelta(minutes=1)


def _wall_now() -> datetime:
    from datetime import UTC

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
