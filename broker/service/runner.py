"""``broker serve``: the API on every replica; the scheduler and the engine on the leader only.

Every replica serves the whole API (a submission writes a PENDING job, a notice is recorded by
whichever replica gets it). One replica at a time holds the leader lease (``leader.py``); it
starts an APScheduler ``BackgroundScheduler`` whose jobs live in the store (``apscheduler_jobs``)
and run the engine's step, reconcile, price polls, report schedules and time-based policy changes.
On the ``local`` backend the replicas share one market replay; on ``skypilot`` the engine launches
real clusters through SkyPilot and decides on the price book the leader's polls keep current.
The engine it builds writes through a store fenced by the lease's epoch and calls the cloud
through a fenced provisioner, so it can do nothing once the lease is gone. A replica that loses
the lease stops its scheduler at once and goes back to trying for it.
"""

from __future__ import annotations

import logging
import signal
import socket
import threading
from collections.abc import Callable
from datetime import UTC, datetime
from types import FrameType
from typing import Any

import uvicorn

from broker.api.app import create_app
from broker.api.serving import server_config
from broker.backends.fenced import FencedProvisioner
from broker.backends.local.runtime import served_world
from broker.config.settings import ConfigError, Settings
from broker.config.teams import budget_refusal, fair_share_config
from broker.engine import Engine
from broker.intake import Intake
from broker.runtime import assemble
from broker.service import tasks
from broker.service.hooks import resolve
from broker.service.leader import LeaseLock, leader_lock, lease_seconds
from broker.service.schedule_config import policy_cron_trigger
from broker.service.timepolicy import admission_check, apply_due_policies
from broker.service.wake import StepGate, Wake, listen_for_writes, watch_writes
from broker.store import Store
from broker.store.db import FencedStore

log = logging.getLogger("broker.service")
SCHEDULER_TABLE = "apscheduler_jobs"


class Service:
    def __init__(self, settings: Settings, store: Store | None = None, sdk: Any = None, catalog: Any = None) -> None:
        """``sdk`` and ``catalog`` stand in for SkyPilot's own in tests (or the ``skypilot_sdk`` setting)."""
        if settings.backend not in ("local", "skypilot"):
            raise ConfigError(f"backend: expected local or skypilot, got {settings.backend!r}")
        self.settings = settings
        self.price_poller = resolve(settings.price_poller, "price_poller")
        self.report_runner = resolve(settings.report_runner, "report_runner")
        world = served_world(settings) if settings.backend == "local" else None
        self.runtime = assemble(settings, store, world=world, sdk=sdk, catalog=catalog)
        self.lock: LeaseLock = leader_lock(self.runtime.store, settings.home,
                                           lease_seconds(settings.leader_check_seconds))
        self.leading = False
        self.engine: Engine | None = None
        self.step_gate: StepGate | None = None
        self.work_store: Store = self.runtime.store  # fenced by the lease's epoch while leading
        self.scheduler: Any = None
        self.ticker: Any = None  # the engine's tick (``build_ticker``)
        self.wake = Wake()  # what this process wrote to the store: the tick reads it only then (or due)
        watch_writes(self.runtime.store, self.wake)
        self.unlisten: Callable[[], None] = lambda: None  # the leader's wake by other replicas' writes
        self.listener: Any = None  # EventBridge spot warnings through SQS, on the SkyPilot backend's leader
        self._stop = threading.Event()
        self._leadership = threading.Lock()
        self.socket = self._bind(settings.serve_host, settings.serve_port)
        host, port = self.socket.getsockname()[:2]
        self.url = f"http://{host}:{port}"
        self.public_url = settings.public_url or f"http://{'127.0.0.1' if host == '0.0.0.0' else host}:{port}"
        intake = Intake(settings.home, self.runtime.provisioner.name, self.runtime.offered(),
                           offline=settings.offline_catalog, max_gpus=settings.max_gpus,
                           **budget_refusal(settings))
        self.app = create_app(self.runtime.store, self.runtime.clock, intake, is_leader=lambda: self.leading,
                              fair_share=fair_share_config(settings), budgets=settings.budgets)
        self.server = uvicorn.Server(server_config(self.app, log_config=None, timeout_graceful_shutdown=5))

    @staticmethod
    def _bind(host: str, port: int) -> socket.socket:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError as exc:
            sock.close()
            raise ConfigError(f"--host/--port: cannot listen on {host}:{port}: {exc.strerror}") from None
        return sock

    # ----------------------------------------------------------------- leadership

    def confirm_leadership(self) -> bool:
        """The lease, as this process sees it (before each task): no round trip, so it can run before every step.

        A lease that ran out here (a stall, failed renewals) stops every task at once; the campaign
        loop demotes the replica on its next pass.
        """
        return self.leading and self.lock.check()

    def _campaign(self) -> None:
        with self._leadership:
            if not self.leading:
                if self.lock.try_acquire():
                    self._promote()
            elif not self.lock.check():
                self._demote("lease lost")

    def _renew(self) -> None:
        """Renew the lease every leader check, on a thread of its own: starting the engine or a slow
        campaign must not make the leader miss its renewals (it would lose the lease for nothing)."""
        while not self._stop.is_set():
            if self.leading and self.lock.epoch is not None:
                try:
                    self.lock.renew()
                except Exception:
                    log.exception("leader lease: renewal failed")
            self._stop.wait(self.settings.leader_check_seconds)

    def _promote(self) -> None:
        fence = self.lock.fence
        self.leading = True
        log.info("leader: acquired the leader lease (epoch %d); starting the scheduler and the engine", fence.epoch,
                 extra={"event": "leader_acquired", "epoch": fence.epoch})
        self.work_store = self.runtime.store.fenced(fence)
        self.engine = self.runtime.engine(self.public_url, store=self.work_store,
                                          provisioner=FencedProvisioner(self.runtime.provisioner, fence.ensure),
                                          admit=admission_check(self.settings.capacity_gpus))
        self.step_gate = StepGate(self.runtime.store, self.runtime.clock, self.runtime.market, wake=self.wake)
        self.unlisten = listen_for_writes(self.runtime.store, self.wake)
        apply_due_policies(self.work_store, self.settings.policy_schedules, datetime.now(UTC))
        tasks.bind(self)
        self.scheduler = build_scheduler(self.runtime.store, self.settings)
        start_scheduler(self.scheduler)
        self.ticker = build_ticker(self.settings)
        self.ticker.start()
        self.listener = self.runtime.backend.notice_listener(self.work_store, self.settings)

    def _demote(self, reason: str) -> None:
        self.leading = False
        self.lock.release()  # the local view first: running tasks stop at their next step or cloud call
        log.warning("leader: lost leadership (%s); stopping the scheduler and the engine", reason,
                    extra={"event": "leader_lost"})
        self._stop_scheduler()
        self.engine = None
        self.step_gate = None
        self.work_store = self.runtime.store

    def _stop_listener(self) -> None:
        if self.listener is not None:
            try:
                self.listener.stop()
            except Exception as exc:
                log.debug("SQS listener stop: %s", exc)
            self.listener = None

    def _stop_scheduler(self) -> None:
        self._stop_listener()
        self.unlisten()
        for name in ("ticker", "scheduler"):
            scheduler = getattr(self, name)
            if scheduler is not None:
                try:
                    scheduler.shutdown(wait=False)
                except Exception as exc:
                    log.debug("%s shutdown: %s", name, exc)
                setattr(self, name, None)

    def reconcile(self) -> None:
        check = self.work_store.fence.ensure if isinstance(self.work_store, FencedStore) else None
        self.runtime.reconcile(self.work_store, check)

    # ----------------------------------------------------------------- running

    def run(self) -> None:
        """Serve until SIGTERM/SIGINT; campaign for leadership every ``leader_check_seconds``."""
        for signum in (signal.SIGTERM, signal.SIGINT):
            signal.signal(signum, self._on_signal)
        thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.socket]}, daemon=True,
                                  name="api")
        thread.start()
        threading.Thread(target=self._renew, daemon=True, name="lease").start()
        log.info("serving the API at %s (agents report to %s)", self.url, self.public_url,
                 extra={"event": "listening", "url": self.url})
        try:
            while not self._stop.is_set():
                try:
                    self._campaign()
                except Exception:
                    log.exception("leader campaign failed")
                self._stop.wait(self.settings.leader_check_seconds)
        finally:
            self.shutdown()
            self.server.should_exit = True
            thread.join(timeout=10)

    def stop(self) -> None:
        self._stop.set()

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        self.lock.close()  # fenced from this instant: no step, no write, no cloud call
        log.info("received %s; stopping", signal.Signals(signum).name)
        self.stop()

    def shutdown(self) -> None:
        self.lock.close()
        self._stop_scheduler()
        # A task that was running stops at its next fence check; the lease is handed back after
        # it has (a fenced transaction already past its check holds the lease row until it ends).
        if not tasks.drain(10.0):
            log.warning("leader: a task is still running after 10 s; releasing the lease anyway")
        with self._leadership:
            if self.leading:
                self.leading = False
                epoch = self.lock.epoch
                self.lock.release()
                log.info("leader: released the leader lease (epoch %s)", epoch,
                         extra={"event": "leader_released", "epoch": epoch})
            tasks.bind(None)
        self.runtime.store.dispose()


def build_scheduler(store: Store, settings: Settings) -> Any:
    """A BackgroundScheduler with its jobs in the store, holding exactly the jobs the settings call for."""
    from apscheduler.executors.pool import ThreadPoolExecutor
    from apscheduler.jobstores.sqlalchemy import SQLAlchemyJobStore
    from apscheduler.schedulers.background import BackgroundScheduler

    scheduler = BackgroundScheduler(
        jobstores={"default": SQLAlchemyJobStore(engine=store.engine, tablename=SCHEDULER_TABLE)},
        executors={"default": ThreadPoolExecutor(4)},
        job_defaults={"coalesce": True, "max_instances": 1, "misfire_grace_time": 60},
        timezone=UTC,
    )
    wanted: dict[str, dict[str, Any]] = {
        "reconcile": {"func": tasks.reconcile, "trigger": "interval",
                      "seconds": settings.reconcile_seconds},
        "reports": {"func": tasks.run_reports, "trigger": "interval",
                    "seconds": settings.report_check_seconds},
    }
    for cloud, seconds in sorted(settings.price_poll_seconds.items()):
        wanted[f"prices-{cloud}"] = {"func": tasks.poll_prices, "trigger": "interval",
                                     "seconds": seconds, "args": [cloud]}
        if settings.backend == "skypilot":  # the engine decides on these quotes: a new leader polls at once
            wanted[f"prices-{cloud}"]["next_run_time"] = datetime.now(UTC)
    for schedule in settings.policy_schedules:
        wanted[f"policy-{schedule.name}"] = {"func": tasks.apply_policies,
                                             "trigger": policy_cron_trigger(schedule.cron, schedule.timezone)}
    # Added before start(): on start they replace the copies a previous leader left in the store.
    for job_id, spec in wanted.items():
        scheduler.add_job(id=job_id, name=job_id, replace_existing=True, **spec)
    return scheduler


def build_ticker(settings: Settings) -> Any:
    """The engine's tick, every ``poll_seconds``, on a scheduler of its own that keeps it in memory.

    It is the leader's own and starts afresh with each leader; kept with the other jobs in the store,
    every tick would read the store's schedule and rewrite its next run time (three statements, five
    times a second) even when the step gate says there is nothing to do.
    """
    from apscheduler.executors.pool import ThreadPoolExecutor
    from apscheduler.jobstores.memory import MemoryJobStore
    from apscheduler.schedulers.background import BackgroundScheduler

    ticker = BackgroundScheduler(jobstores={"default": MemoryJobStore()}, executors={"default": ThreadPoolExecutor(1)},
                                 job_defaults={"coalesce": True, "max_instances": 1, "misfire_grace_time": 60},
                                 timezone=UTC)
    ticker.add_job(tasks.engine_step, "interval", seconds=settings.poll_seconds, id="engine-step", name="engine-step")
    return ticker


def start_scheduler(scheduler: Any) -> None:
    """Start, then drop stored jobs a previous leader had that the settings no longer call for."""
    wanted = {job.id for job in scheduler.get_jobs()}
    scheduler.start()
    for job in scheduler.get_jobs():
        if job.id not in wanted:
            scheduler.remove_job(job.id)
            log.info("scheduler: removed job %s, no longer in the settings", job.id)
