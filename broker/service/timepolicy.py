"""Time-based policy changes as data: schedules fire, overrides are written, the engine reads them.

Each ``PolicySchedule`` sets values for keys like ``queue_priority:training`` at its cron fire
times. Applying is idempotent and replica-safe: a key is only rewritten by a fire later than the
one that set it, so a late or repeated run (or a new leader catching up) changes nothing twice.
Queue priorities are also written onto the queue's active jobs, since the engine orders its work
by ``JobRow.priority``; capacity shares are read by the admission check before a job leaves PENDING.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from broker.model import ACTIVE_STATES, JobState
from broker.service.schedule_config import PolicySchedule, policy_cron_trigger
from broker.spec.values import PRIORITY_CLASSES
from broker.store import Store
from broker.store.tables import JobRow, PolicyOverrideRow
from policies import kinds
from policies.admission import AdmissionRequest

log = logging.getLogger("broker.service.policy")

LOOKBACK = timedelta(days=8)  # covers any weekly schedule


@dataclass(frozen=True)
class Override:
    key: str
    value: float
    schedule: str
    fire_time: datetime


def queue_of(spec_data: dict[str, Any]) -> str:
    """A job's queue: the priority class its job file names (``training`` when it names none)."""
    written = (spec_data.get("broker") or {}).get("priority") if isinstance(spec_data, dict) else None
    if written is None:
        return "training"
    if isinstance(written, str) and written in PRIORITY_CLASSES:
        return written
    for name, number in PRIORITY_CLASSES.items():
        if str(written) == str(number):
            return name
    return "custom"


def last_fire(schedule: PolicySchedule, now: datetime) -> datetime | None:
    """The latest fire time of the schedule at or before ``now`` (within a week and a day)."""
    trigger = policy_cron_trigger(schedule.cron, schedule.timezone)
    latest = None
    fire = trigger.get_next_fire_time(None, now - LOOKBACK)
    while fire is not None and fire <= now:
        latest = fire
        fire = trigger.get_next_fire_time(fire, fire + timedelta(seconds=1))
    return latest


def due_overrides(schedules: Sequence[PolicySchedule], now: datetime) -> dict[str, Override]:
    """For every key, the value of the schedule that fired last at or before ``now``."""
    result: dict[str, Override] = {}
    for schedule in schedules:
        fire = last_fire(schedule, now)
        if fire is None:
            continue
        for key, value in schedule.overrides().items():
            current = result.get(key)
            if current is None or fire > current.fire_time:
                result[key] = Override(key, value, schedule.name, fire)
    return result


def apply_due_policies(store: Store, schedules: Sequence[PolicySchedule], now: datetime) -> list[Override]:
    """Write every override whose fire is newer than the stored one; returns those written."""
    written: list[Override] = []
    for override in sorted(due_overrides(schedules, now).values(), key=lambda o: (o.fire_time, o.key)):
        with store.transaction() as s:
            row = s.get(PolicyOverrideRow, override.key, with_for_update=True)
            if row is not None and row.fire_time >= override.fire_time:
                continue
            if row is None:
                s.add(PolicyOverrideRow(key=override.key, value=override.value, schedule=override.schedule,
                                        fire_time=override.fire_time, applied_at=now))
            else:
                row.value, row.schedule, row.fire_time, row.applied_at = (
                    override.value, override.schedule, override.fire_time, now)
            kind, queue = override.key.split(":", 1)
            if kind == "queue_priority":
                _reprioritise(s, queue, int(override.value))
        written.append(override)
        log.info("policy %s = %s (schedule %s, fired %s)", override.key, override.value, override.schedule,
                 override.fire_time.isoformat())
    return written


def _reprioritise(s: Session, queue: str, priority: int) -> None:
    for job in s.scalars(select(JobRow).where(JobRow.state.in_(ACTIVE_STATES))):
        if queue_of(job.spec) == queue and job.priority != priority:
            job.priority = priority


def priority_for(s: Session, queue: str) -> int | None:
    row = s.get(PolicyOverrideRow, f"queue_priority:{queue}")
    return int(row.value) if row is not None else None


def admission_check(capacity_gpus: int | None, policy: str | None = None) -> Callable[[Session, JobRow], bool]:
    """The engine's gate before a job leaves PENDING: the admission policy over the queue's holdings."""
    decide = kinds.admission.get(policy)

    def admit(s: Session, job: JobRow) -> bool:
        queue = queue_of(job.spec)
        share = s.get(PolicyOverrideRow, f"capacity_share:{queue}")
        if capacity_gpus is None or share is None:
            return True
        held = 0
        started = [state for state in ACTIVE_STATES if state != JobState.PENDING.value]
        for other in s.scalars(select(JobRow).where(JobRow.state.in_(started), JobRow.id != job.id)):
            if queue_of(other.spec) == queue:
                held += other.num_nodes * other.gpus_per_node
        request = AdmissionRequest(queue=queue, gpus=job.num_nodes * job.gpus_per_node, held_by_queue=held,
                                   capacity_gpus=capacity_gpus, share=share.value)
        return bool(decide(request))

    return admit
