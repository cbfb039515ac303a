"""A job's checkpoints and attempts: which checkpoint it resumes from, and what work it lost.

The newest complete checkpoint is the later of the one reported on a notice and the marker the
job writes in its checkpoint directory. An attempt cut short counts the work since that
checkpoint as lost; progress is the running time of every attempt less what was lost.
"""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import select
from sqlalchemy.orm import Session

from broker.agent.checkpoint import latest_checkpoint
from broker.clock import Clock
from broker.engine.notices import notices_of
from broker.spec import JobSpec
from broker.store.tables import AllocationRow, JobRow, NoticeRow


def current_allocation(s: Session, job: JobRow) -> AllocationRow | None:
    """The allocation of the job's latest attempt (ended or not); None before its first start."""
    if job.attempt == 0:
        return None
    return s.scalar(select(AllocationRow).where(AllocationRow.job_id == job.id,
                                                AllocationRow.attempt == job.attempt))


def checkpointed_since(clock: Clock, job: JobRow, spec: JobSpec, requested: datetime) -> bool:
    """The job marked a checkpoint complete after ``requested``, or its grace to do so ran out."""
    mark = latest_checkpoint(job.checkpoint_dir)
    if mark is not None and clock.to_clock(mark.written_at) >= requested:
        return True
    return clock.now() >= requested + spec.broker.checkpoint.grace


def record_checkpoint(clock: Clock, job: JobRow, notice: NoticeRow) -> None:
    """Take the checkpoint a notice reports, if it is newer than the one the job has."""
    if notice.checkpoint and notice.checkpoint != job.checkpoint:
        at = notice.detail.get("checkpoint_at") if notice.detail else None
        when = clock.to_clock(datetime.fromisoformat(at).timestamp()) if at else clock.now()
        if job.checkpoint_at is None or when >= job.checkpoint_at:
            job.checkpoint, job.checkpoint_at = notice.checkpoint, when


def refresh_checkpoint(s: Session, clock: Clock, job: JobRow, cluster_id: str) -> None:
    """The newest complete checkpoint: the last one reported on a notice, or the marker itself."""
    for notice in notices_of(s, cluster_id):
        record_checkpoint(clock, job, notice)
    mark = latest_checkpoint(job.checkpoint_dir)
    if mark is not None:
        written = clock.to_clock(mark.written_at)
        if job.checkpoint_at is None or written > job.checkpoint_at:
            job.checkpoint, job.checkpoint_at = mark.path, written


def end_allocation(alloc: AllocationRow, outcome: str, at: datetime) -> None:
    if alloc.ended_at is None:
        alloc.ended_at = at
        alloc.outcome = outcome


def close_attempt(job: JobRow, alloc: AllocationRow, stopped: datetime) -> None:
    """End an attempt cut short and count the work done since its last checkpoint as lost."""
    end_allocation(alloc, "preempted", stopped)
    began = alloc.running_at or alloc.started_at
    kept_until = job.checkpoint_at if job.checkpoint_at and job.checkpoint_at > began else began
    job.work_lost_s += max((stopped - kept_until).total_seconds(), 0.0)


def progress_s(s: Session, job: JobRow, now: datetime) -> float:
    """Work done and kept: running time of every attempt, less what was lost to preemptions."""
    done = 0.0
    for alloc in s.scalars(select(AllocationRow).where(AllocationRow.job_id == job.id)):
        start = alloc.running_at or alloc.started_at
        end = alloc.ended_at or now
        done += max((end - start).total_seconds(), 0.0)
    return max(done - job.work_lost_s, 0.0)
