"""What node agents report besides notices: each complete checkpoint, and the job's progress.

``POST /v1/checkpoints`` and ``POST /v1/progress``. The token is checked before the body is read,
a token is good only for its own cluster while that cluster is up, and bodies are small. The
engine resumes from, and decides moves by, the checkpoints recorded here.
"""

from __future__ import annotations

import time
from datetime import UTC, datetime
from typing import Annotated

from fastapi import APIRouter, Depends, HTTPException, status
from pydantic import BaseModel, Field
from sqlalchemy import select

from broker.api.auth import agent_dependency
from broker.api.validation import body_schema, json_body
from broker.clock import Clock
from broker.engine.checkpoint_reports import CheckpointRefused, ReportedCheckpoint, record
from broker.store import Store
from broker.store.tables import AllocationRow, JobRow, ProgressRow

# An agent reports a checkpoint as it appears: a time far from now is a broken clock or a forgery.
WALL_SKEW_SECONDS = 24 * 3600.0
MAX_SAVE_SECONDS = 24 * 3600.0


class CheckpointReport(BaseModel):
    job_id: str = Field(min_length=1, max_length=32, pattern=r"^[A-Za-z0-9_.-]+$")
    cluster_id: str = Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_.:-]+$")
    node: str = Field(default="0", min_length=1, max_length=100, pattern=r"^[A-Za-z0-9_.-]+$")
    path: str = Field(min_length=1, max_length=1024)
    written_at: datetime
    step: int | None = Field(default=None, ge=0, le=2**62)
    # How long the save took, as the job measured it (``save_seconds=`` in ``LATEST``; broker.job writes it).
    save_seconds: float | None = Field(default=None, ge=0, le=MAX_SAVE_SECONDS, allow_inf_nan=False)


class CheckpointAccepted(BaseModel):
    report_id: int
    duplicate: bool


class ProgressReport(BaseModel):
    job_id: str = Field(min_length=1, max_length=32, pattern=r"^[A-Za-z0-9_.-]+$")
    cluster_id: str = Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_.:-]+$")
    node: str = Field(default="0", min_length=1, max_length=100, pattern=r"^[A-Za-z0-9_.-]+$")
    step: int = Field(ge=0, le=2**62)
    total: int | None = Field(default=None, gt=0, le=2**62)
    at: datetime


def _own_cluster(owner: str, reported: str) -> None:
    if owner != reported:
        raise HTTPException(status.HTTP_403_FORBIDDEN, "cluster_id: this token may only report for its own cluster")


def _wall(value: datetime, field: str) -> float:
    """An agent's wall time as epoch seconds; one far from now is a broken clock or a forgery."""
    value = value if value.tzinfo else value.replace(tzinfo=UTC)
    if abs(value.timestamp() - time.time()) > WALL_SKEW_SECONDS:
        raise HTTPException(status.HTTP_422_UNPROCESSABLE_CONTENT, f"{field}: more than a day from now")
    return value.timestamp()


def agent_reports_router(store: Store, clock: Clock) -> APIRouter:
    router = APIRouter()
    agent = agent_dependency(store)

    @router.post("/v1/checkpoints", status_code=status.HTTP_202_ACCEPTED, response_model=CheckpointAccepted,
                 openapi_extra=body_schema(CheckpointReport))
    def post_checkpoint(*, owner: str = Depends(agent), report: Annotated[
            CheckpointReport, Depends(json_body(CheckpointReport))]) -> CheckpointAccepted:
        _own_cluster(owner, report.cluster_id)
        written = _wall(report.written_at, "written_at")
        try:
            report_id, duplicate = record(store, ReportedCheckpoint(
                job_id=report.job_id, cluster_id=report.cluster_id, node=report.node, path=report.path,
                written_at=clock.to_clock(written), step=report.step, save_seconds=report.save_seconds),
                received_at=clock.now())
        except CheckpointRefused as exc:
            raise HTTPException(status.HTTP_422_UNPROCESSABLE_CONTENT, str(exc)) from None
        return CheckpointAccepted(report_id=report_id, duplicate=duplicate)

    @router.post("/v1/progress", status_code=status.HTTP_202_ACCEPTED, openapi_extra=body_schema(ProgressReport))
    def post_progress(*, owner: str = Depends(agent),
                      report: Annotated[ProgressReport, Depends(json_body(ProgressReport))]) -> dict[str, bool]:
        _own_cluster(owner, report.cluster_id)
        at = clock.to_clock(_wall(report.at, "at"))
        with store.transaction() as s:
            job = s.get(JobRow, report.job_id)
            running_here = s.scalar(select(AllocationRow.id).where(
                AllocationRow.job_id == report.job_id, AllocationRow.cluster_id == report.cluster_id,
                AllocationRow.ended_at.is_(None)).limit(1))
            if job is None or running_here is None:
                raise HTTPException(status.HTTP_422_UNPROCESSABLE_CONTENT, "job_id: that job is not running here")
            s.add(ProgressRow(job_id=job.id, attempt=job.attempt, step=report.step, total=report.total, at=at))
        return {"recorded": True}

    return router
