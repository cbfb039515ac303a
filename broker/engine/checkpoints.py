"""A job's checkpoints and attempts: which checkpoint it resumes from, and what work it lost.

The newest complete checkpoint is the newest one the job's agents reported, on a notice or as it
appeared (``broker.engine.checkpoint_reports``): the engine never reads a checkpoint directory, so a
bucket works like a local path. An attempt cut short counts the work since that checkpoint as
lost; progress is the running time of every attempt less what was lost.
"""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import select
from sqlalchemy.orm import Session

from broker.clock import Clock
from broker.engine import checkpoint_reports
from broker.engine.notices import notices_of
from broker.spec.job import JobSpec
from broker.store.tables import AllocationRow, JobRow, NoticeRow


def current_allocation(s: Session, job: JobRow) -> AllocationRow | None:
    """The allocation of the job's latest attempt (ended or not); None before its first start."""
    if job.attempt == 0:
        return None
    return s.scalar(select(AllocationRow).where(AllocationRow.job_id == job.id,
                                                AllocationRow.attempt == job.attempt))


def reported_since(s: Session, job: JobRow, requested: datetime) -> bool:
    """An agent reported a checkpoint of the job written at or after ``requested``."""
    return checkpoint_reports.newest(s, job, since=requested) is not None


def grace_over(clock: Clock, spec: JobSpec, requested: datetime) -> bool:
    return clock.now() >= requested + spec.broker.checkpoint.grace


def noticed_at(clock: Clock, notice: NoticeRow) -> datetime:
    """When the job was told to checkpoint for ``notice``: when its agent saw the notice (and signalled
    the job at once), else when the broker received it."""
    at = (notice.detail or {}).get("noticed_at")
    try:
        return clock.to_clock(datetime.fromisoformat(str(at)).timestamp()) if at else notice.received_at
    except ValueError:
        return notice.received_at


def record_checkpoint(clock: Clock, job: JobRow, notice: NoticeRow) -> None:
    """Take the checkpoint a notice reports, if it is newer than the one the job has."""
    if notice.checkpoint and notice.checkpoint != job.checkpoint:
        at = notice.detail.get("checkpoint_at") if notice.detail else None
        when = clock.to_clock(datetime.fromisoformat(at).timestamp()) if at else clock.now()
        if job.checkpoint_at is None or when >= job.checkpoint_at:
            job.checkpoint, job.checkpoint_at = notice.checkpoint, when


def refresh_checkpoint(s: Session, clock: Clock, job: JobRow, cluster_id: str) -> None:
    """Take the newest complete checkpoint reported, on a notice of the cluster or on its own."""
    for notice in notices_of(s, cluster_id):
        record_checkpoint(clock, job, notice)
    reported = checkpoint_reports.newest(s, job)
    if reported is not None and (job.checkpoint_at is None or reported.written_at > job.checkpoint_at):
        job.checkpoint = checkpoint_reports.resolve(job.checkpoint_dir, reported.path)
        job.checkpoint_at = reported.written_at


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
    return progress_of(list(s.scalars(select(AllocationRow).where(AllocationRow.job_id == job.id))), job, now)


def progress_of(allocations: list[AllocationRow], job: JobRow, now: datetime) -> float:
    """``progress_s`` from the job's allocations, read already."""
    done = 0.0
    for alloc in allocations:
        start = alloc.running_at or alloc.started_at
        end = alloc.ended_at or now
        done += max((end - start).total_seconds(), 0.0)
    return max(done - job.work_lost_s, 0.0)
