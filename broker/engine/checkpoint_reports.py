"""Checkpoints the node agents report: the one record the engine decides from.

An agent reports every new complete checkpoint it sees on its node (``$BROKER_CHECKPOINT_DIR/LATEST``,
which is a mounted bucket on real clouds) with its cluster's token. Paths are stored relative to the
job's checkpoint directory, so the same report names the same checkpoint on every cluster; the
engine never looks at a disk to learn what a job has saved. (On the local backend, whose nodes are
this machine, an engine started after one was killed takes in the checkpoints its agents could not
report, through ``record`` too: ``broker.backends.local.recovery``.)
"""

from __future__ import annotations

import posixpath
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from broker.errors import UserError
from broker.store import Store
from broker.store.tables import AllocationRow, CheckpointReportRow, JobRow

MAX_PATH_CHARS = 1024


class CheckpointRefused(UserError, ValueError):
    """A report the broker will not record; the message names the field."""


@dataclass(frozen=True, slots=True)
class ReportedCheckpoint:
    job_id: str
    cluster_id: str
    node: str
    path: str  # relative to the job's checkpoint directory
    written_at: datetime  # market clock
    step: int | None = None
    save_seconds: float | None = None  # wall seconds the save took, as the job measured it


def clean_relative_path(path: str) -> str:
    """``path`` as a normalised relative path inside the checkpoint directory, or CheckpointRefused."""
    if not path or len(path) > MAX_PATH_CHARS:
        raise CheckpointRefused(f"path: expected 1-{MAX_PATH_CHARS} characters")
    if "\x00" in path or "\\" in path:
        raise CheckpointRefused("path: NUL bytes and backslashes are not allowed")
    if any("\ud800" <= c <= "\udfff" for c in path):  # not encodable: the store would raise, not refuse
        raise CheckpointRefused("path: lone surrogates are not allowed")
    if path.startswith("/") or "://" in path:
        raise CheckpointRefused("path: expected a path relative to the job's checkpoint directory")
    normal = posixpath.normpath(path)
    if normal == "." or normal == ".." or normal.startswith("../"):
        raise CheckpointRefused("path: must lie inside the job's checkpoint directory")
    return normal


def resolve(checkpoint_dir: str, relative: str) -> str:
    """The reported checkpoint as the broker names it: inside the job's directory (a path or a URL)."""
    return checkpoint_dir.rstrip("/") + "/" + relative


def record(store: Store, report: ReportedCheckpoint, received_at: datetime) -> tuple[int, bool]:
    """Store a report once per (job, path); (report id, whether it was a duplicate).

    The job must have held GPUs of the reporting cluster: a cluster's token cannot report for
    another cluster's job.
    """
    path = clean_relative_path(report.path)
    try:
        with store.transaction() as s:
            held = s.scalar(select(AllocationRow.id).where(AllocationRow.job_id == report.job_id,
                                                           AllocationRow.cluster_id == report.cluster_id).limit(1))
            if held is None:
                raise CheckpointRefused("job_id: this cluster never ran that job")
            row = CheckpointReportRow(job_id=report.job_id, cluster_id=report.cluster_id, node=report.node,
                                      path=path, step=report.step, written_at=report.written_at,
                                      received_at=received_at, save_seconds=report.save_seconds)
            s.add(row)
            s.flush()
            return row.id, False
    except IntegrityError:
        pass
    with store.transaction() as s:
        existing = s.scalar(select(CheckpointReportRow.id).where(CheckpointReportRow.job_id == report.job_id,
                                                                 CheckpointReportRow.path == path))
    assert existing is not None
    return existing, True


def newest(s: Session, job: JobRow, since: datetime | None = None) -> CheckpointReportRow | None:
    """The newest checkpoint reported for ``job`` (written at or after ``since``, when given)."""
    query = select(CheckpointReportRow).where(CheckpointReportRow.job_id == job.id)
    if since is not None:
        query = query.where(CheckpointReportRow.written_at >= since)
    return s.scalar(query.order_by(CheckpointReportRow.written_at.desc(), CheckpointReportRow.id.desc()).limit(1))
