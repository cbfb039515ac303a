"""The job state machine: every change of a job's state, each a small function, and nothing else.

This module is the only writer of ``JobRow.state`` (and counts the jobs not yet in a terminal
one). Every change goes through the transition table in ``broker.model``, is stamped with the
market's clock, and leaves a ``transition`` event; a job entering CHECKPOINTING carries why
(``CheckpointReason``), cleared when it leaves.

PENDING -> PROVISIONING -> RUNNING -> (CHECKPOINTING -> MIGRATING -> RUNNING)* -> terminal
"""

from __future__ import annotations

import logging
import secrets
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from broker.clock import Clock
from broker.engine.parts import jsonable
from broker.errors import UserError
from broker.model import ACTIVE_STATES, CheckpointReason, JobState, check_transition
from broker.spec.job import JobSpec, Pipeline
from broker.store import Store
from broker.store.tables import JobEventRow, JobRow

# What is stored with submitted jobs in their transaction, given their ids (``broker.api.idempotency``).
Within = Callable[[Session, list[str]], None]

log = logging.getLogger("broker.engine")


class UnknownJob(UserError, LookupError):
    http_status = 404

    def __str__(self) -> str:
        return str(self.args[0])


def _move(s: Session, clock: Clock, job: JobRow, target: JobState, **detail: object) -> None:
    current = JobState(job.state)
    check_transition(current, target)
    now = clock.now()
    job.state = target.value
    job.updated_at = now
    if target is not JobState.CHECKPOINTING:
        job.checkpoint_reason = None
    if target.terminal:
        job.finished_at = now
        job.wall_finished_at = datetime.now(UTC)
        job.target_cluster_id = job.target_gpus = None
    s.add(JobEventRow(job_id=job.id, at=now, kind="transition", from_state=current.value,
                      to_state=target.value, detail=jsonable(detail)))
    log.info("job %s: %s -> %s %s", job.id, current, target, detail or "")


def submit_job(store: Store, clock: Clock, spec: JobSpec, home: Path, backend: str,
               within: Within | None = None) -> str:
    """Record a validated job as PENDING, in one transaction; the engine takes it from there.
    ``within`` writes what must be stored with the job, in its transaction (an idempotency key)."""
    with store.transaction() as s:
        job_id = _add_job(s, clock, spec, home, backend)
        if within is not None:
            within(s, [job_id])
        return job_id


def submit_jobs(store: Store, clock: Clock, specs: list[JobSpec], home: Path, backend: str) -> list[str]:
    """Record many validated jobs as PENDING in one transaction (a backlog arriving at once)."""
    with store.transaction() as s:
        return [_add_job(s, clock, spec, home, backend) for spec in specs]


def submit_pipeline(store: Store, clock: Clock, pipeline: Pipeline, home: Path, backend: str,
                    within: Within | None = None) -> list[str]:
    """Record every stage of a pipeline as a PENDING job, in one transaction. In a chain each stage
    waits for the one before it to succeed (``broker.engine.stages``); a group's stages run together."""
    pipeline_id = f"p-{secrets.token_hex(4)}"
    job_ids: list[str] = []
    with store.transaction() as s:
        for number, spec in enumerate(pipeline.stages, start=1):
            after = job_ids[-1] if pipeline.kind == "chain" and job_ids else None
            job_ids.append(_add_job(s, clock, spec, home, backend, pipeline_id=pipeline_id, stage=number,
                                    after_job_id=after))
        if within is not None:
            within(s, job_ids)
    return job_ids


def _add_job(s: Session, clock: Clock, spec: JobSpec, home: Path, backend: str, pipeline_id: str | None = None,
             stage: int | None = None, after_job_id: str | None = None) -> str:
    now = clock.now()
    job_id = f"j-{secrets.token_hex(4)}"
    checkpoint_dir = spec.broker.checkpoint.dir or str(home / "checkpoints" / job_id)
    s.add(JobRow(
        id=job_id, name=spec.name, team=spec.broker.team, state=JobState.PENDING.value,
        priority=spec.broker.priority, spec=spec.to_data(),
        spec_path=str(Path(spec.source).resolve()) if spec.source else None,
        backend=backend, num_nodes=spec.num_nodes, gpus_per_node=spec.gpus_per_node,
        accelerator=spec.accelerator, deadline=spec.broker.deadline_at(now),
        work_s=spec.broker.work.total_seconds() if spec.broker.work else None,
        checkpoint_dir=checkpoint_dir, attempt=0, preemptions=0, migrations=0, work_lost_s=0.0,
        zones=[], created_at=now, updated_at=now, wall_started_at=datetime.now(UTC),
        pipeline_id=pipeline_id, stage=stage, after_job_id=after_job_id,
    ))
    s.flush()
    detail: dict[str, object] = {"name": spec.name}
    if pipeline_id is not None:
        detail.update(pipeline=pipeline_id, stage=stage, after=after_job_id)
    s.add(JobEventRow(job_id=job_id, at=now, kind="submitted", to_state=JobState.PENDING.value, detail=detail))
    return job_id


def cancel_job(store: Store, job_id: str, clock: Clock) -> str:
    """Mark a job cancelled in one transaction; the engine tears its clusters down on its next step."""
    with store.transaction() as s:
        job = s.get(JobRow, job_id, with_for_update=True)
        if job is None:
            raise UnknownJob(f"no job {job_id!r}")
        if JobState(job.state).terminal:
            return job.state
        cancelled(s, clock, job)
        return JobState.CANCELLED.value


def cancelled(s: Session, clock: Clock, job: JobRow, reason: str = "cancelled by user") -> None:
    _move(s, clock, job, JobState.CANCELLED, reason=reason)


def provisioning(s: Session, clock: Clock, job: JobRow, **detail: object) -> None:
    """Heading to GPUs: a cluster launched for it, free GPUs of a running one, or GPUs being freed."""
    _move(s, clock, job, JobState.PROVISIONING, **detail)


def running(s: Session, clock: Clock, job: JobRow, **detail: object) -> None:
    _move(s, clock, job, JobState.RUNNING, **detail)


def checkpointing(s: Session, clock: Clock, job: JobRow, why: CheckpointReason, **detail: object) -> None:
    """Told to save its work before it leaves its GPUs, and why."""
    _move(s, clock, job, JobState.CHECKPOINTING, checkpoint_reason=why.value, **detail)
    job.checkpoint_reason = why.value


def migrating(s: Session, clock: Clock, job: JobRow, **detail: object) -> None:
    """On its way from the nodes it lost or left to new ones, resuming from its checkpoint."""
    _move(s, clock, job, JobState.MIGRATING, **detail)


def requeued(s: Session, clock: Clock, job: JobRow, **detail: object) -> None:
    _move(s, clock, job, JobState.PENDING, **detail)


def succeeded(s: Session, clock: Clock, job: JobRow) -> None:
    job.exit_code = 0
    job.preempted_by = None
    _move(s, clock, job, JobState.SUCCEEDED)


def start_retried(s: Session, clock: Clock, job: JobRow, **detail: object) -> None:
    """Its start failed, or its nodes have no process of it: back to heading for the same GPUs."""
    _move(s, clock, job, JobState.PROVISIONING, **detail)


def start_failed(s: Session, clock: Clock, job: JobRow, tries: int, error: str) -> None:
    """It could not be started, ``tries`` times: it fails with the last error as its reason."""
    job.reason = f"could not start ({tries} {'try' if tries == 1 else 'tries'}): {error}"
    _move(s, clock, job, JobState.FAILED, tries=tries, error=error)


def failed(s: Session, clock: Clock, job: JobRow, exit_code: int | None) -> None:
    job.exit_code = exit_code
    job.reason = f"the job exited with code {exit_code}"
    _move(s, clock, job, JobState.FAILED, exit_code=exit_code)


def active_job_count(store: Store) -> int:
    with store.transaction() as s:
        return int(s.scalar(select(func.count()).select_from(JobRow).where(JobRow.state.in_(ACTIVE_STATES))) or 0)
