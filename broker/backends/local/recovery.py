"""What a killed embedded engine's agents could not tell it, recovered by the engine started next.

An embedded engine (``broker launch``/``broker engine``) serves the API its clusters' agents report
to. Killed (``kill -9``), it leaves them reporting to nothing until another engine starts: a
checkpoint completed in between, on a notice above all, was never recorded, and the job went back
to an older one. Two things close that gap on the local backend, whose nodes are this machine:

- the agents report to ``file://HOME/local/agents.url`` (``broker.agent.reporting.current_url``),
  the address of whichever engine runs now, which each embedded engine writes as it starts;
- as it starts, the engine reads each active job's ``LATEST`` and records the newest complete
  checkpoint of the job's current attempt through ``checkpoint_reports.record``: the same
  validation as an agent's report (a path inside the job's directory, from a cluster that ran
  the job), and one checkpoint is recorded once whoever reports it. The step it names is recorded
  as the job's progress when no report said as much: a job that went on (or finished) while no
  engine ran showed the step it had reached when the engine died.
"""

from __future__ import annotations

import logging
import os
from datetime import datetime
from pathlib import Path

from sqlalchemy import select

from broker.agent.checkpoint import latest_checkpoint
from broker.clock import Clock
from broker.engine.checkpoint_reports import CheckpointRefused, ReportedCheckpoint, record
from broker.model import ACTIVE_STATES
from broker.store import Store
from broker.store.private import private_directory, private_opener
from broker.store.tables import AllocationRow, JobRow, ProgressRow

log = logging.getLogger("broker.engine")

ADDRESS_FILE = Path("local") / "agents.url"


def publish_address(home: Path, api_url: str) -> str:
    """Write where this engine listens to the agents' address file; the address agents are given."""
    path = home / ADDRESS_FILE
    private_directory(path.parent)
    tmp = path.with_name(f".{path.name}.{os.getpid()}")
    with open(tmp, "w", opener=private_opener) as handle:
        handle.write(api_url + "\n")
    os.replace(tmp, path)
    return f"file://{path}"


def recover_checkpoints(store: Store, clock: Clock) -> list[str]:
    """Record each active job's newest checkpoint on disk written during its current attempt, if no
    agent did; returns the ids of the jobs that gained one."""
    with store.transaction() as s:
        attempts = s.execute(
            select(JobRow.id, JobRow.checkpoint_dir, AllocationRow.cluster_id, AllocationRow.started_at)
            .join(AllocationRow, (AllocationRow.job_id == JobRow.id) & (AllocationRow.attempt == JobRow.attempt))
            .where(JobRow.state.in_(ACTIVE_STATES))).all()
    recovered: list[str] = []
    for job_id, directory, cluster_id, began in attempts:
        mark = latest_checkpoint(directory)
        if mark is None or not os.path.exists(mark.path):  # a marker naming nothing is no checkpoint
            continue
        written = clock.to_clock(mark.written_at)
        if written < began:
            continue  # an earlier attempt's, reported then (or another job's, in a shared directory)
        try:
            _, duplicate = record(store, ReportedCheckpoint(
                job_id=job_id, cluster_id=cluster_id, node="0", path=os.path.relpath(mark.path, directory),
                written_at=written, step=mark.step, save_seconds=mark.save_seconds), received_at=clock.now())
        except CheckpointRefused as exc:
            log.warning("job %s: checkpoint %r on disk not taken: %s", job_id, mark.path[:200], exc)
            continue
        if mark.step is not None:
            _record_progress(store, job_id, mark.step, written)
        if not duplicate:
            log.info("job %s: recovered checkpoint %s, which its agents could not report", job_id, mark.path[:200])
            recovered.append(job_id)
    return recovered


def _record_progress(store: Store, job_id: str, step: int, at: datetime) -> None:
    """``step``, which a checkpoint of the current attempt reached at ``at``, as the job's progress,
    unless a report of this attempt already said as much (its total is the job's last one)."""
    with store.transaction() as s:
        job = s.get(JobRow, job_id)
        last = s.scalar(select(ProgressRow).where(ProgressRow.job_id == job_id)
                        .order_by(ProgressRow.at.desc(), ProgressRow.id.desc()).limit(1))
        if job is None or (last is not None and last.attempt == job.attempt and last.step >= step):
            return
        s.add(ProgressRow(job_id=job_id, attempt=job.attempt, step=step, total=last.total if last else None,
                          at=max(at, last.at) if last is not None else at))
