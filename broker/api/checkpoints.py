"""``POST /v1/checkpoints``: node agents report each complete checkpoint of their job.

The token is checked before the body is read, and a token is good only for its own cluster while
that cluster is up. The engine resumes from, and decides moves by, what is recorded here.
"""

from __future__ import annotations

import time
from datetime import UTC, datetime
from typing import Annotated

from fastapi import APIRouter, Depends, HTTPException, Request, status
from pydantic import BaseModel, Field, ValidationError
from sqlalchemy import select

from broker.api.auth import bearer_token
from broker.checkpoints import CheckpointRefused, ReportedCheckpoint, cluster_accepts_reports, record
from broker.clock import Clock
from broker.store import Store
from broker.store.tables import ClusterRow
from broker.tokens import token_digest

MAX_BODY_BYTES = 16 * 1024
# An agent reports a checkpoint as it appears: a time far from now is a broken clock or a forgery.
WALL_SKEW_SECONDS = 24 * 3600.0


class CheckpointReport(BaseModel):
    job_id: str = Field(min_length=1, max_length=32, pattern=r"^[A-Za-z0-9_.-]+$")
    cluster_id: str = Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_.:-]+$")
    node: str = Field(default="0", min_length=1, max_length=100, pattern=r"^[A-Za-z0-9_.-]+$")
    path: str = Field(min_length=1, max_length=1024)
    written_at: datetime
    step: int | None = Field(default=None, ge=0, le=2**62)


class CheckpointAccepted(BaseModel):
    report_id: int
    duplicate: bool


async def _bounded_body(request: Request, limit: int) -> bytes:
    """The body, read no further than ``limit`` bytes (a client may lie in Content-Length)."""
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit:
        raise HTTPException(status.HTTP_413_CONTENT_TOO_LARGE, f"body: at most {limit} bytes")
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise HTTPException(status.HTTP_413_CONTENT_TOO_LARGE, f"body: at most {limit} bytes")
        chunks.append(chunk)
    return b"".join(chunks)


def checkpoints_router(store: Store, clock: Clock) -> APIRouter:
    router = APIRouter()

    @router.post("/v1/checkpoints", status_code=status.HTTP_202_ACCEPTED, response_model=CheckpointAccepted)
    async def post_checkpoint(request: Request, token: Annotated[str, Depends(bearer_token)]) -> CheckpointAccepted:
        with store.transaction() as s:
            cluster = s.scalar(select(ClusterRow).where(ClusterRow.token_hash == token_digest(token)))
            cluster_id = cluster.id if cluster is not None else None
            accepts = cluster_accepts_reports(cluster)
        if cluster_id is None or not accepts:
            raise HTTPException(status.HTTP_401_UNAUTHORIZED, "unknown or expired agent token",
                                headers={"WWW-Authenticate": "Bearer"})
        body = await _bounded_body(request, MAX_BODY_BYTES)
        try:
            report = CheckpointReport.model_validate_json(body)
        except ValidationError as exc:
            first = exc.errors()[0]
            field = ".".join(str(part) for part in first["loc"]) or "body"
            raise HTTPException(status.HTTP_422_UNPROCESSABLE_CONTENT, f"{field}: {first['msg']}") from None
        if report.cluster_id != cluster_id:
            raise HTTPException(status.HTTP_403_FORBIDDEN, "cluster_id: this token may only report for its own cluster")
        written = report.written_at if report.written_at.tzinfo else report.written_at.replace(tzinfo=UTC)
        if abs(written.timestamp() - time.time()) > WALL_SKEW_SECONDS:
            raise HTTPException(status.HTTP_422_UNPROCESSABLE_CONTENT, "written_at: more than a day from now")
        try:
            report_id, duplicate = record(store, ReportedCheckpoint(
                job_id=report.job_id, cluster_id=report.cluster_id, node=report.node, path=report.path,
                written_at=clock.to_clock(written.timestamp()), step=report.step), received_at=clock.now())
        except CheckpointRefused as exc:
            raise HTTPException(status.HTTP_422_UNPROCESSABLE_CONTENT, str(exc)) from None
        return CheckpointAccepted(report_id=report_id, duplicate=duplicate)

    return router
