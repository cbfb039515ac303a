"""``POST /v1/notices``: node agents report preemption notices for their own cluster.

An agent authenticates with the token the broker issued to its cluster; a token for one cluster
cannot report for another. The same notice reported twice (two nodes, a retry, the SQS path and
the agent racing) is recorded once (``broker.notices.record``); a later report may only add the
checkpoint.
"""

from __future__ import annotations

import posixpath
import re
from typing import Annotated, Any

from fastapi import APIRouter, Depends, HTTPException, status
from pydantic import BaseModel, Field
from sqlalchemy import select

from broker.api.auth import agent_dependency
from broker.api.validation import Text, When, body_schema, json_body
from broker.clock import Clock
from broker.notices.record import KINDS, MAX_CHECKPOINT, MAX_CLUSTER_ID, MAX_NODE, Notice, record_notice, to_clock
from broker.store import Store
from broker.store.tables import ClusterRow, JobRow


class NoticeReport(BaseModel):
    # Lengths are those of the columns the values are stored in.
    cluster_id: Text = Field(min_length=1, max_length=MAX_CLUSTER_ID)
    node: Text = Field("0", max_length=MAX_NODE)
    kind: str = Field(pattern=f"^({'|'.join(KINDS)})$")
    action_time: When = None
    noticed_at: When = None
    signaled_at: When = None
    checkpoint: Text | None = Field(default=None, max_length=MAX_CHECKPOINT)
    checkpoint_at: When = None


notice_body = json_body(NoticeReport)


class NoticeAccepted(BaseModel):
    notice_id: int
    duplicate: bool


def checkpoint_allowed(path: str, checkpoint_dir: str, job_id: str, backend: str) -> bool:
    """``path`` lies inside the job's checkpoint directory as a node sees it (``..`` cannot climb out)."""
    from broker.backends.skypilot.task import CHECKPOINT_MOUNT, LOCAL_CHECKPOINT_ROOT, is_bucket, split_bucket

    if is_bucket(checkpoint_dir):
        inside = split_bucket(checkpoint_dir)[1]
        roots = [checkpoint_dir.rstrip("/"), posixpath.join(CHECKPOINT_MOUNT, inside) if inside else CHECKPOINT_MOUNT]
    else:
        roots = [posixpath.normpath(checkpoint_dir)]
    if ".." in path.split("/"):
        return False
    candidate = path.rstrip("/") if "://" in path else posixpath.normpath(path)
    if any(candidate == root or candidate.startswith(root.rstrip("/") + "/") for root in roots):
        return True
    # A cloud node without a bucket keeps the job's checkpoints under its own $HOME (see sky_task).
    node_local = re.compile(rf"^/.+/{re.escape(LOCAL_CHECKPOINT_ROOT)}/{re.escape(job_id)}(/|$)")
    return backend != "local" and not is_bucket(checkpoint_dir) and bool(node_local.match(candidate))


def _unprocessable(field: str, message: str, kind: str) -> HTTPException:
    return HTTPException(status.HTTP_422_UNPROCESSABLE_CONTENT,
                         [{"loc": ["body", field], "type": kind, "msg": f"{field}: {message}"}])


def notices_router(store: Store, clock: Clock) -> APIRouter:
    router = APIRouter()
    agent = agent_dependency(store)

    @router.post("/v1/notices", status_code=status.HTTP_202_ACCEPTED, response_model=NoticeAccepted,
                 openapi_extra=body_schema(NoticeReport))
    def post_notice(*, owner: str = Depends(agent),
                    report: Annotated[NoticeReport, Depends(notice_body)]) -> NoticeAccepted:
        if owner != report.cluster_id:
            raise HTTPException(status.HTTP_403_FORBIDDEN, "this token may only report for its own cluster")
        for field in ("action_time", "noticed_at", "signaled_at", "checkpoint_at"):
            value = getattr(report, field)
            try:
                to_clock(clock, value, strict=True)
            except (OverflowError, ValueError):
                raise _unprocessable(field, f"{value.isoformat()} is beyond what the broker's clock can hold",
                                     "time_range") from None
        if report.checkpoint is not None:
            with store.transaction() as s:
                job = s.execute(select(JobRow.id, JobRow.checkpoint_dir, JobRow.backend)
                                .join(ClusterRow, ClusterRow.job_id == JobRow.id)
                                .where(ClusterRow.id == owner)).first()
            if job is None or not checkpoint_allowed(report.checkpoint, job.checkpoint_dir, job.id, job.backend):
                raise _unprocessable("checkpoint", "must lie under the job's checkpoint directory",
                                     "checkpoint_outside")
        recorded = record_notice(store, clock, notice_of(report, clock), source="agent")
        return NoticeAccepted(notice_id=recorded.notice_id, duplicate=recorded.duplicate)

    return router


def notice_of(report: NoticeReport, clock: Clock) -> Notice:
    """The notice an agent reported, its action time on the broker's clock."""
    detail: dict[str, Any] = {
        "node": report.node,
        "noticed_at": report.noticed_at.isoformat() if report.noticed_at else None,
        "signaled_at": report.signaled_at.isoformat() if report.signaled_at else None,
        "checkpoint_at": report.checkpoint_at.isoformat() if report.checkpoint_at else None,
    }
    return Notice(report.cluster_id, report.kind, node=report.node, action_time=to_clock(clock, report.action_time),
                  checkpoint=report.checkpoint, detail=detail)
