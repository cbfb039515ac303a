"""The scheduler's recurring tasks, as module functions so its job store can keep them by name.

APScheduler's SQLAlchemy job store persists each job as a reference (``module:function``) and
its arguments, so a task cannot carry the service it acts on: the leader binds itself here, as a
``Leader`` (what a task needs of it), when a replica becomes leader.
Each task runs only while the service holds the leader lease, and stops at the first refused
write or cloud call (``Fenced``) once it does not.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Protocol

from broker.config.settings import Settings
from broker.engine import Engine
from broker.engine.step import freeze_long_lived
from broker.store import Store
from broker.store.db import Fenced

if TYPE_CHECKING:
    from broker.service.wake import StepGate


class Leader(Protocol):
    """What the tasks need of the replica leading (``broker.service.runner.Service``)."""

    settings: Settings
    work_store: Store  # fenced by the lease's epoch
    engine: Engine | None
    step_gate: StepGate | None  # when the engine steps (None: on every tick)
    price_poller: Callable[[Store, Settings, str], object]
    report_runner: Callable[[Store, Settings, datetime], object]

    def confirm_leadership(self) -> bool: ...
    def reconcile(self) -> None: ...


log = logging.getLogger("broker.service.tasks")
_service: Leader | None = None
_running = 0
_idle = threading.Condition()


def bind(service: Leader | None) -> None:
    global _service
    _service = service


def drain(timeout_s: float) -> bool:
    """Wait until no task is running (they stop at their next fence check); False on a timeout."""
    deadline = time.monotonic() + timeout_s
    with _idle:
        while _running:
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            _idle.wait(left)
    return True


def _as_leader(work: Callable[[Leader], object]) -> None:
    global _running
    service = _service
    if service is None or not service.confirm_leadership():
        return
    with _idle:
        _running += 1
    try:
        work(service)
    except Fenced as exc:
        log.warning("leader: stopped by the fence: %s", exc, extra={"event": "fenced"})
    finally:
        with _idle:
            _running -= 1
            _idle.notify_all()


def engine_step() -> None:
    """Move every job on by at most one transition: dispatch, provisioning, migration, teardown, metering;
    only when something happened or is under way (``broker.service.wake``)."""

    def step(service: Leader) -> None:
        engine, gate = service.engine, service.step_gate
        if engine is None:
            return
        if gate is not None and not gate.should_step():
            return
        before = gate.read()[-1] if gate is not None else None
        engine.step()
        freeze_long_lived()
        if gate is not None:
            gate.stepped(before)
        from broker.api.metrics import engine_heartbeat

        engine_heartbeat.beat()

    _as_leader(step)


def reconcile() -> None:
    _as_leader(lambda service: service.reconcile())


def poll_prices(cloud: str) -> None:
    _as_leader(lambda service: service.price_poller(service.work_store, service.settings, cloud))


def run_reports() -> None:
    _as_leader(lambda service: service.report_runner(service.work_store, service.settings, datetime.now(UTC)))


def apply_policies() -> None:
    from broker.service.timepolicy import apply_due_policies

    _as_leader(lambda service: apply_due_policies(service.work_store, service.settings.policy_schedules,
                                                  datetime.now(UTC)))
