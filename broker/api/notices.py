"""``POST /v1/notices``: node agents report preemption notices for their own cluster.

An agent authenticates with the token the broker issued to its cluster; a token for one cluster
cannot report for another. The same notice reported twice (two nodes, a retry, the SQS path and
the agent racing) is recorded once; a later report may only add the checkpoint.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Header, HTTPException, status
from pydantic import BaseModel, Field
from sqlalchemy import select
from sqlalchemy.exc import IntegrityError

from broker.clock import Clock
from broker.store import Store
from broker.store.tables import ClusterRow, NoticeRow
from broker.tokens import token_digest


class NoticeReport(BaseModel):
    cluster_id: str = Field(min_length=1)
    node: str = "0"
    kind: str = Field(pattern="^(terminate|stop|hibernate|rebalance|maintenance)$")
    action_time: datetime | None = None
    noticed_at: datetime | None = None
    signaled_at: datetime | None = None
    checkpoint: str | None = None
    checkpoint_at: datetime | None = None


class NoticeAccepted(BaseModel):
    notice_id: int
    duplicate: bool


def _bearer(authorization: Annotated[str | None, Header()] = None) -> str:
    if not authorization or not authorization.lower().startswith("bearer "):
        raise HTTPException(status.HTTP_401_UNAUTHORIZED, "missing bearer token",
                            headers={"WWW-Authenticate": "Bearer"})
    return authorization.split(" ", 1)[1].strip()


def notices_router(store: Store, clock: Clock) -> APIRouter:
    router = APIRouter()

    @router.post("/v1/notices", status_code=status.HTTP_202_ACCEPTED, response_model=NoticeAccepted)
    def post_notice(report: NoticeReport, token: Annotated[str, Depends(_bearer)]) -> NoticeAccepted:
        digest = token_digest(token)
        with store.transaction() as s:
            owner = s.scalar(select(ClusterRow.id).where(ClusterRow.token_hash == digest))
            if owner is None:
                raise HTTPException(status.HTTP_401_UNAUTHORIZED, "unknown token")
            if owner != report.cluster_id:
                raise HTTPException(status.HTTP_403_FORBIDDEN, "this token may only report for its own cluster")
        return record_notice(store, clock, report)

    return router


def _to_clock(clock: Clock, value: datetime | None) -> datetime | None:
    if value is None:
        return None
    value = value if value.tzinfo else value.replace(tzinfo=UTC)
    return clock.to_clock(value.timestamp())


def record_notice(store: Store, clock: Clock, report: NoticeReport, source: str = "agent") -> NoticeAccepted:
    """Record a notice once per ``<cluster>:<kind>``, whoever reports it first (an agent, SQS); a later
    report of the same notice only adds a newer checkpoint."""
    key = f"{report.cluster_id}:{report.kind}"
    detail: dict[str, Any] = {
        "node": report.node,
        "noticed_at": report.noticed_at.isoformat() if report.noticed_at else None,
        "signaled_at": report.signaled_at.isoformat() if report.signaled_at else None,
        "checkpoint_at": report.checkpoint_at.isoformat() if report.checkpoint_at else None,
    }
    try:
        with store.transaction() as s:
            row = NoticeRow(dedup_key=key, cluster_id=report.cluster_id, node=report.node, kind=report.kind,
                            source=source, action_time=_to_clock(clock, report.action_time),
                            received_at=clock.now(), checkpoint=report.checkpoint, detail=detail)
            s.add(row)
            s.flush()
            return NoticeAccepted(notice_id=row.id, duplicate=False)
    except IntegrityError:
        pass
    with store.transaction() as s:
        existing = s.scalar(select(NoticeRow).where(NoticeRow.dedup_key == key).with_for_update())
        assert existing is not None
        newer = report.checkpoint_at is not None and (
            existing.detail.get("checkpoint_at") is None
            or report.checkpoint_at.isoformat() > str(existing.detail["checkpoint_at"]))
        if report.checkpoint and existing.checkpoint != report.checkpoint and newer:
            existing.checkpoint = report.checkpoint
            existing.detail = {**(existing.detail or {}), "checkpoint_at": detail["checkpoint_at"]}
        return NoticeAccepted(notice_id=existing.id, duplicate=True)
