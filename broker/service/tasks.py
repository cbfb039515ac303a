"""The scheduler's recurring tasks, as module functions so its job store can keep them by name.

APScheduler's SQLAlchemy job store persists each job as a reference (``module:function``) and
its arguments; the running service they act on is bound here when a replica becomes leader.
"""

from __future__ import annotations

import logging
from datetime import UTC, datetime
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from broker.service.runner import Service

log = logging.getLogger("broker.service.tasks")
_service: Service | None = None


def bind(service: Service | None) -> None:
    global _service
    _service = service


def _leading() -> Service | None:
    service = _service
    if service is None or not service.confirm_leadership():
        return None
    return service


def engine_step() -> None:
    """Move every job on by at most one transition: dispatch, provisioning, migration, teardown, metering."""
    service = _leading()
    if service is not None and service.engine is not None:
        service.engine.step()


def reconcile() -> None:
    service = _leading()
    if service is not None:
        service.reconcile()


def poll_prices(cloud: str) -> None:
    service = _leading()
    if service is not None:
        service.price_poller(service.store, service.settings, cloud)


def run_reports() -> None:
    service = _leading()
    if service is not None:
        service.report_runner(service.store, service.settings, datetime.now(UTC))


def apply_policies() -> None:
    from broker.service.timepolicy import apply_due_policies

    service = _leading()
    if service is not None:
        apply_due_policies(service.store, service.settings.policy_schedules, datetime.now(UTC))
