"""Pipelines: a chained stage waits in PENDING until the stage before it has succeeded.

Each stage of a multi-document job file is a job of its own (``machine.submit_pipeline``), so it
is placed, preempted and migrated on its own; this module only holds a chained stage back. When
the stage before it ends any other way, the rest of the chain is cancelled with that reason, as
SkyPilot's managed pipelines stop at a failed task. A stage's relative deadline (``deadline: 3h``)
counts from the moment it is released, not from the pipeline's submission.
"""

from __future__ import annotations

from datetime import timedelta

from sqlalchemy.orm import Session

from broker.engine import machine
from broker.engine.parts import Parts
from broker.model import JobState
from broker.store.tables import JobEventRow, JobRow


def held_back(parts: Parts, s: Session, job: JobRow) -> bool:
    """True while ``job`` must not start yet; cancels it when the stage before it ended unsuccessfully."""
    if job.after_job_id is None:
        return False
    before = s.get(JobRow, job.after_job_id)
    state = JobState(before.state) if before is not None else JobState.CANCELLED
    if state is JobState.SUCCEEDED:
        _release(parts, s, job)
        return False
    if not state.terminal:
        return True
    name = before.name if before is not None else job.after_job_id
    why = f"stage {(job.stage or 1) - 1} ({name}) ended {state.value}: the pipeline stops there"
    machine.cancelled(s, parts.clock, job, reason=why)
    job.reason = why
    return True


def _release(parts: Parts, s: Session, job: JobRow) -> None:
    """The stage before succeeded: this one is an ordinary queued job from now on."""
    now = parts.clock.now()
    relative = parts.spec_of(job).broker.deadline
    if isinstance(relative, timedelta):
        job.deadline = now + relative
    s.add(JobEventRow(job_id=job.id, at=now, kind="released", to_state=job.state,
                      detail={"after": job.after_job_id, "stage": job.stage}))
    job.after_job_id = None
