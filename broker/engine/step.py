"""The engine: the job state machine, driven one idempotent step at a time.

Each ``step()`` reads the store, asks the provisioner where things stand, and moves every job
on by at most one transition, each in its own transaction. Nothing is kept in memory that the
store does not also hold (the parsed-spec cache is only a cache), so an engine started after a
crash picks up exactly where the last one stopped.
"""

from __future__ import annotations

import contextlib
import gc
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import replace
from datetime import datetime

from sqlalchemy import select
from sqlalchemy.orm import Session

from broker.backends.base import Provisioner, RunStatus
from broker.clock import Clock
from broker.engine import clusters, eager, forecast, gpu_attribution, metering, setup_ahead
from broker.engine.fair_share import FairShare
from broker.engine.jobs import JobStepper
from broker.engine.notices import TERMINATE_KINDS
from broker.engine.parts import EngineOptions, Parts
from broker.engine.planning import Planner
from broker.engine.queue import QueueView, Shapes
from broker.engine.running import Running, RunningView
from broker.market.book import Market
from broker.model import ACTIVE_STATES, JobState
from broker.spec.job import JobSpec
from broker.store import Store
from broker.store.tables import AllocationRow, JobRow, NoticeRow
from policies.selection import Location, SelectionRequest

# How often a step's notices' lane looks again for termination notices while the step goes on.
NOTICE_EVERY = 0.5  # seconds


_frozen = False


def freeze_long_lived() -> None:
    """Once per process, after its engine's first step: keep what lives as long as the process out of
    the cycle collector's scans.

    The imports, the settings and the views' kept rows of every queued and running job are hundreds of
    thousands of objects; every full collection scanned them all (0.2-0.9 s at 10,000 queued and 2,000
    running, in about a third of the steps). Frozen, a full collection scans only what came since
    (about 0.03 s). Reference counting still frees them when dropped; only a cycle among them would
    outlive its use, and the views' rows hold none.
    """
    global _frozen
    if not _frozen:
        gc.collect()
        gc.freeze()
        _frozen = True


class Engine:
    def __init__(self, store: Store, clock: Clock, market: Market, provisioner: Provisioner,
                 options: EngineOptions, tokens: Callable[[str], str]) -> None:
        self.parts = Parts(store, clock, market, provisioner, options, tokens)
        self.planner = Planner(self.parts)
        self.jobs = JobStepper(self.parts, self.planner)
        self._shapes = Shapes(self.parts)
        self._lock = threading.Lock()
        self._in_step = False
        self._view: tuple[int, QueueView] | None = None  # the step's last queue view, with the store's writes then
        self._running: dict[str, Running] = {}  # the running jobs as the last running view read them (a cache)
        self._unpredicted: dict[str, tuple[int, datetime]] = {}  # running jobs nothing could predict yet, and when
        self._notices_read = 0.0  # when the notices' lane last looked (time.monotonic)
        self.fair_share: FairShare | None = None
        if options.fair_share is not None:
            self.fair_share = FairShare(self.parts, options.fair_share)
            self.parts.options = replace(options, admit=self.fair_share.gate(options.admit))

    @property
    def store(self) -> Store:
        return self.parts.store

    @property
    def clock(self) -> Clock:
        return self.parts.clock

    @property
    def provisioner(self) -> Provisioner:
        return self.parts.provisioner

    @property
    def options(self) -> EngineOptions:
        return self.parts.options

    def submit(self, spec: JobSpec) -> str:
        """``spec`` stored PENDING through ``broker.intake`` (the engine's own tests; the market they
        set up is theirs to judge), and remembered so that it is not read back."""
        from broker.intake import Intake, submit

        (job_id,) = submit(self.store, self.clock, Intake(self.options.home, self.provisioner.name), spec)
        self.parts.remember(job_id, spec)
        return job_id

    def step(self) -> None:
        """One pass over everything, in this order:

        1. sync every live cluster with the backend (up, failed, gone; relaunch one a crash left unlaunched);
           then, with teams named, fair share: the queued gangs their teams' shares and budgets hold back
           wait this step, and borrowed GPUs an owner's gang waits for are asked back at a checkpoint
           (``broker.engine.fair_share``);
        2. move every active job on by at most one transition, highest priority first (a queued job that
           certainly waits is passed over: ``broker.engine.queue``);
        3. give up the reservations of jobs whose running job runs late when they could run elsewhere
           sooner (eager allocation), then let queued jobs take GPUs that step 2 freed (not a cluster
           an early boot took the room of), before idle clusters are reaped;
        4. ready the queued jobs still waiting for a running job's predicted finish (eager allocation,
           a reserved job's setup run ahead), and stop the early setups of jobs no longer heading there;
        5. tear down clusters nobody holds or is heading to, unless the pool keeps them a while;
        6. write the ledger's minutes up to now, and split its running ones by what their GPUs did (at most
           ``metering.PER_STEP`` clusters a step, those metered least far first: a fleet's minute is spread
           over a few steps, each cluster's minutes written once, whole);
        7. keep a fresh finish-time prediction for every running job (at most ``forecast.PER_STEP`` a step,
           the stalest first).

        The notices' lane runs first, and again whenever ``NOTICE_EVERY`` has passed since it last looked
        (between the phases above, and between jobs in a pass): a notice that arrives during a long step is
        acted on within about that long, not at the next step.
        """
        with self._lock, self._stepping():
            self.act_on_notices()
            clusters.sync(self.parts)
            if self.fair_share is not None:
                self.fair_share.step()
            self.advance_all(self.active_jobs(), running=True)
            eager.give_up(self.parts, self.planner)
            eager.release_leaving(self.parts)
            self.notices_if_due()
            self.advance_all(self.active_jobs(JobState.PENDING))
            eager.ready_next(self.parts, self.planner)
            setup_ahead.stop_stale(self.parts)
            clusters.reap(self.parts)
            self.notices_if_due()
            metering.meter(self.store, self.clock, self.parts.market, limit=metering.PER_STEP)
            gpu_attribution.attribute(self.store, self.parts.options.gpu_idle_below, self.clock.now())
            self.notices_if_due()
            forecast.record(self.store, self.clock.now(), self._unpredicted, limit=forecast.PER_STEP)
            self.notices_if_due()

    @contextlib.contextmanager
    def _stepping(self) -> Iterator[None]:
        """While a step runs, ``notices_if_due`` may run the notices' lane again, and a pass may take the last
        pass's queue view (``_queue_view``)."""
        self._in_step = True
        try:
            yield
        finally:
            self._in_step = False
            self._view = None

    def notices_if_due(self) -> bool:
        """In a step, the notices' lane again if ``NOTICE_EVERY`` has passed since it last looked; True if
        it moved a job. Outside a step (a pass driven on its own, as the parity tests do) nothing."""
        if not self._in_step or time.monotonic() - self._notices_read < NOTICE_EVERY:
            return False
        return self.act_on_notices()

    def act_on_notices(self) -> bool:
        """The notices' lane, first in a step: the running jobs on clusters with a termination notice not
        yet acted on are moved on before the fleet-wide work (a notice gives 30 s to 2 minutes; the whole
        step, with thousands of jobs, takes seconds). A notice the backend reports is recorded by the
        sync and acted on later in the same step, as before."""
        with self.store.transaction() as s:
            job_ids = list(s.scalars(
                select(AllocationRow.job_id).join(NoticeRow, NoticeRow.cluster_id == AllocationRow.cluster_id)
                .join(JobRow, JobRow.id == AllocationRow.job_id)
                .where(NoticeRow.kind.in_(TERMINATE_KINDS), NoticeRow.handled_at.is_(None),
                       AllocationRow.ended_at.is_(None), JobRow.state == JobState.RUNNING.value,
                       AllocationRow.attempt == JobRow.attempt)
                .order_by(JobRow.priority.desc(), JobRow.created_at)))
        self._notices_read = time.monotonic()
        moved = False
        for job_id in dict.fromkeys(job_ids):
            moved = self.jobs.advance(job_id) or moved
        return moved

    def advance_all(self, job_ids: list[str], running: bool = False) -> None:
        """Advance each job in turn, passing over the queued ones the queue's view says wait and (``running``:
        the pass that holds running jobs) the running ones its view says are quiet; a view is read again
        once anything has moved (the notices' lane too, when it is due between jobs)."""
        view: QueueView | None = None
        quiet: RunningView | None = None
        statuses: dict[tuple[str, int], RunStatus] = {}  # the runs' statuses, asked once per pass
        for job_id in job_ids:
            if self.notices_if_due():
                view = quiet = None
            if self.options.queue_fast_path:
                view = view or self._queue_view()
                if view.waits(job_id):
                    continue
                if running and job_id not in view.queued:
                    quiet = quiet or RunningView(self.parts, self.jobs.cadence, self.jobs.reviewer, statuses,
                                                 self._running)
                    if quiet.quiet(job_id):
                        continue
            if self.jobs.advance(job_id, view):
                view = quiet = None

    def _queue_view(self) -> QueueView:
        """The queue's view: in a step, the one the last pass read while nothing in this process has written
        to the store since (the step's second pass over the queue, when the first moved nothing and the
        eager phases between them changed nothing, reads no view of its own); else one read now."""
        writes = self.store.writes.count
        if self._in_step and self._view is not None and self._view[0] == writes:
            return self._view[1]
        view = QueueView(self.parts, self._shapes)
        self._view = (writes, view) if self._in_step else None
        return view

    def active_jobs(self, only: JobState | None = None) -> list[str]:
        states = [only.value] if only else ACTIVE_STATES
        with self.store.transaction() as s:
            return list(s.connection().scalars(select(JobRow.id).where(JobRow.state.in_(states))
                                  .order_by(JobRow.priority.desc(), JobRow.created_at)))

    def selection_request(self, s: Session, job: JobRow, current: Location, exclude: set[str]) -> SelectionRequest:
        """What the selection policy would be asked for ``job`` now (the parity test compares it to the simulator's)."""
        return self.planner.selection_request(s, job, current, exclude)
