"""A reserved job's ``setup`` run ahead of its start, so that when its GPUs free up only ``run`` is left.

When a queued job reserves the GPUs of a running job (``broker.engine.eager``), its ``setup`` starts
at once on that cluster's nodes, beside the job still running there (``Provisioner.prepare_job``: a
sidecar process on the local backend, a ``sky exec`` asking for no GPU on SkyPilot). An
``early_setups`` row keeps it open until one of these ends it:

- **the start** (``ready``): once the GPUs are free, an early setup that succeeded means the job is
  started with ``run`` only (``early_setup_done``); one still running is waited for (the rest of it
  is shorter than a setup from the beginning); one that failed, was lost or never began is stopped
  and the job starts the ordinary way, its setup at the start (``early_setup_failed``, with why);
- **the sweep** (``stop_stale``, every step): a job that no longer heads for that cluster (cancelled,
  failed, requeued when the cluster went) has its early setup stopped (``early_setup_stopped``).
"""

from __future__ import annotations

import logging

from sqlalchemy import select
from sqlalchemy.orm import Session

from broker.backends.base import JobLaunch, RunPhase
from broker.engine import clusters, shares
from broker.engine.parts import AfterCommit, Parts, cluster_info
from broker.model import JobState
from broker.store.tables import ClusterRow, EarlySetupRow, JobRow
from policies.gang import GangPlacement

log = logging.getLogger("broker.engine")


def job_launch(parts: Parts, job: JobRow, target: ClusterRow, placement: GangPlacement, attempt: int,
               setup_done: bool = False) -> JobLaunch:
    """One start (or early setup) of ``job`` on ``target``: the gang's GPUs and the checkpoint contract."""
    spec = parts.spec_of(job)
    return JobLaunch(
        job_id=job.id, attempt=attempt, spec=spec, placement=placement,
        checkpoint_dir=job.checkpoint_dir, resume_from=job.checkpoint,
        broker_url=parts.options.broker_url, log_dir=str(parts.options.home / "logs" / job.id),
        gpu_share=job.gpu_share, gpu_memory_mb=shares.memory_mb(target, spec, job.gpu_share),
        setup_done=setup_done, gpu_sampler=parts.options.gpu_sampler, gpu_idle_below=parts.options.gpu_idle_below,
    )


def begin(parts: Parts, s: Session, job: JobRow, target: ClusterRow, placement: GangPlacement,
          after: AfterCommit) -> None:
    """Start the setup of ``job`` on the GPUs it has just reserved (nothing to do if it has none)."""
    if not parts.spec_of(job).setup:
        return
    attempt = job.attempt + 1  # the attempt its start will be
    s.add(EarlySetupRow(job_id=job.id, cluster_id=target.id, attempt=attempt, started_at=parts.clock.now()))
    parts.event(s, job.id, "early_setup", cluster=target.id, attempt=attempt)
    after.prepares.append((cluster_info(target), job_launch(parts, job, target, placement, attempt)))


def _open(s: Session, job_id: str) -> list[EarlySetupRow]:
    return list(s.scalars(select(EarlySetupRow).where(EarlySetupRow.job_id == job_id,
                                                      EarlySetupRow.ended_at.is_(None))))


def ready(parts: Parts, s: Session, job: JobRow, target: ClusterRow, after: AfterCommit) -> bool | None:
    """About to start ``job`` on ``target``: True if its setup already ran there, False if it runs at the
    start, None if the early setup is still running (wait for it)."""
    row = next((r for r in _open(s, job.id) if r.cluster_id == target.id and r.attempt == job.attempt + 1), None)
    if row is None:
        return False
    info = cluster_info(target)
    status = parts.provisioner.prepare_status(info, job.id, row.attempt)
    if status.phase is RunPhase.RUNNING:
        return None
    row.ended_at = parts.clock.now()
    if status.phase is RunPhase.SUCCEEDED:
        row.outcome = "used"
        parts.event(s, job.id, "early_setup_done", cluster=target.id, attempt=row.attempt)
        return True
    row.outcome = "failed"
    why = status.reason or {RunPhase.NOT_STARTED: "it never began", RunPhase.LOST: "its nodes went away"}.get(
        status.phase, f"it ended {status.phase.value}")
    parts.event(s, job.id, "early_setup_failed", cluster=target.id, attempt=row.attempt, reason=why,
                fallback="setup at the start")
    after.prepare_stops.append((info, job.id, row.attempt))  # whatever of it still runs on other nodes
    return False


def stop_stale(parts: Parts) -> None:
    """Stop the early setups of jobs that no longer head for the cluster they were readied on."""
    after = AfterCommit()
    now = parts.clock.now()
    with parts.store.transaction() as s:
        for row in s.scalars(select(EarlySetupRow).where(EarlySetupRow.ended_at.is_(None))):
            job = s.get(JobRow, row.job_id)
            if job is not None and job.state == JobState.PROVISIONING.value \
                    and job.target_cluster_id == row.cluster_id and job.attempt + 1 == row.attempt:
                continue
            row.ended_at, row.outcome = now, "stopped"
            state = job.state if job is not None else "gone"
            parts.event(s, row.job_id, "early_setup_stopped", cluster=row.cluster_id, attempt=row.attempt,
                        reason=f"the job is {state}, no longer heading for {row.cluster_id}")
            cluster = s.get(ClusterRow, row.cluster_id)
            if cluster is not None and cluster.state in clusters.HOLDING:
                after.prepare_stops.append((cluster_info(cluster), row.job_id, row.attempt))
    after.carry_out(parts.provisioner)
