"""Which queued jobs hold a reservation: the GPUs of a running job, claimed by eager allocation.

A job holds one from its ``eager_reserve`` event until it starts (its attempt moves on), gives the
reservation up (``broker.engine.eager.give_up``) or leaves PROVISIONING: while PROVISIONING its
target is the cluster that event names. ``broker.engine.autoscale`` counts these jobs as queued.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from broker.model import JobState
from broker.store.tables import JobEventRow, JobRow


def held(s: Session) -> list[tuple[JobRow, dict[str, Any]]]:
    """Every job holding a reservation, with the detail of the ``eager_reserve`` event that made it."""
    latest: dict[str, tuple[JobRow, dict[str, Any]]] = {}
    for job, detail in s.execute(select(JobRow, JobEventRow.detail).join(JobEventRow, JobEventRow.job_id == JobRow.id)
                                 .where(JobRow.state == JobState.PROVISIONING.value,
                                        JobEventRow.kind == "eager_reserve").order_by(JobEventRow.id)):
        latest[job.id] = (job, dict(detail or {}))
    return [(job, detail) for job, detail in latest.values()
            if job.target_cluster_id is not None and job.target_cluster_id == detail.get("cluster")
            and detail.get("attempt", job.attempt) == job.attempt]


def given_up(s: Session, job_id: str) -> set[tuple[str, int]]:
    """The running jobs (id, attempt) whose GPUs ``job_id`` gave a reservation of up: not reserved again."""
    rows = s.scalars(select(JobEventRow.detail).where(JobEventRow.job_id == job_id,
                                                      JobEventRow.kind == "eager_give_up"))
    return {(str(d.get("after_job")), int(d.get("after_attempt") or 0)) for d in rows if d}
