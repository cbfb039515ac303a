"""The team's other lists, each a page at a time with a cursor: ``/v1/clusters``, ``/v1/pipelines`` and
``/v1/jobs/{job_id}/events``.

Every list is in a stable order (creation, then id), and its cursor is the last item of the page
before (also in the ``X-Next-After`` header when there are more), so rows added meanwhile come after
every row listed and paging never skips or repeats one. A cursor or filter that cannot be one is a
422 naming the parameter.
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Depends, HTTPException, Query, Response, status
from sqlalchemy import and_, func, or_, select

from broker.api.jobs import CURSOR, JobId
from broker.api.validation import query_problem
from broker.store import Store
from broker.store.tables import ClusterRow, JobEventRow, JobRow

DEFAULT_PAGE = 100
MAX_PAGE = 1000
MAX_EVENT_ID = 2**63 - 1
Limit = Annotated[int, Query(ge=1, le=MAX_PAGE, description="items per page")]


def cluster_state(value: str) -> str:
    from broker.model import ClusterState

    states = {s.value for s in ClusterState}
    if value.upper() not in states:
        raise query_problem("state", f"expected one of {', '.join(sorted(states))}")
    return value.upper()


def _next(response: Response, rows: list[Any], limit: int, cursor: Any) -> list[Any]:
    if len(rows) > limit:
        rows = rows[:limit]
        response.headers["X-Next-After"] = str(cursor(rows[-1]))
    return rows


def _cluster(c: ClusterRow) -> dict[str, Any]:
    return {"cluster_id": c.id, "job_id": c.job_id, "state": c.state, "cloud": c.cloud, "region": c.region,
            "zone": c.zone, "instance_type": c.instance_type, "accelerator": c.accelerator,
            "gpus_per_node": c.gpus_per_node, "num_nodes": c.num_nodes, "spot": c.spot,
            "price_per_hour": round(c.price_per_node_hour * c.num_nodes, 4), "reason": c.reason,
            "teardown_reason": c.teardown_reason, "created_at": c.created_at.isoformat(),
            "up_at": c.up_at.isoformat() if c.up_at else None,
            "terminated_at": c.terminated_at.isoformat() if c.terminated_at else None}


def lists_router(store: Store, team_of: Any) -> APIRouter:
    router = APIRouter(tags=["jobs"])

    @router.get("/v1/clusters")
    def clusters(response: Response, team: str = Depends(team_of),
                 state: Annotated[str | None, Query(max_length=20, description="only clusters in this state")] = None,
                 job: Annotated[str | None, Query(max_length=32, pattern=CURSOR,
                                                  description="only the clusters of this job")] = None,
                 limit: Limit = DEFAULT_PAGE,
                 after: Annotated[str | None, Query(max_length=64, pattern=CURSOR,
                                                    description="the last cluster of the page before")] = None,
                 ) -> list[dict[str, Any]]:
        """The clusters launched for the caller's team's jobs, oldest first, a page at a time."""
        with store.transaction() as s:
            query = (select(ClusterRow).join(JobRow, JobRow.id == ClusterRow.job_id).where(JobRow.team == team)
                     .order_by(ClusterRow.created_at, ClusterRow.id))
            if state is not None:
                query = query.where(ClusterRow.state == cluster_state(state))
            if job is not None:
                query = query.where(ClusterRow.job_id == job)
            if after is not None:
                last = s.scalar(select(ClusterRow).join(JobRow, JobRow.id == ClusterRow.job_id)
                                .where(ClusterRow.id == after, JobRow.team == team))
                if last is None:
                    raise query_problem("after", f"no cluster {after!r} of team {team!r} to list from")
                query = query.where(or_(ClusterRow.created_at > last.created_at,
                                        and_(ClusterRow.created_at == last.created_at, ClusterRow.id > last.id)))
            rows = _next(response, list(s.scalars(query.limit(limit + 1))), limit, lambda c: c.id)
            return [_cluster(c) for c in rows]

    @router.get("/v1/pipelines")
    def pipelines(response: Response, team: str = Depends(team_of), limit: Limit = DEFAULT_PAGE,
                  after: Annotated[str | None, Query(max_length=32, pattern=CURSOR,
                                                     description="the last pipeline of the page before")] = None,
                  ) -> list[dict[str, Any]]:
        """The caller's team's pipelines and job groups, oldest first, a page at a time: each one's stages
        (job id, name, state) in order. ``GET /v1/jobs?pipeline=ID`` gives the stages' summaries."""
        with store.transaction() as s:
            first = (select(JobRow.pipeline_id, func.min(JobRow.created_at).label("at"))
                     .where(JobRow.team == team, JobRow.pipeline_id.is_not(None))
                     .group_by(JobRow.pipeline_id).subquery())
            query = select(first.c.pipeline_id, first.c.at).order_by(first.c.at, first.c.pipeline_id)
            if after is not None:
                at = s.scalar(select(first.c.at).where(first.c.pipeline_id == after))
                if at is None:
                    raise query_problem("after", f"no pipeline {after!r} of team {team!r} to list from")
                query = query.where(or_(first.c.at > at, and_(first.c.at == at, first.c.pipeline_id > after)))
            rows = _next(response, list(s.execute(query.limit(limit + 1))), limit, lambda r: r[0])
            ids = [r[0] for r in rows]
            stages: dict[str, list[dict[str, Any]]] = {pid: [] for pid in ids}
            for job in s.scalars(select(JobRow).where(JobRow.pipeline_id.in_(ids), JobRow.team == team)
                                 .order_by(JobRow.stage, JobRow.id)) if ids else []:
                stages[str(job.pipeline_id)].append({"job_id": job.id, "name": job.name, "stage": job.stage,
                                                     "state": job.state})
            return [{"pipeline_id": pid, "submitted_at": at.isoformat(), "stages": stages[pid]} for pid, at in rows]

    @router.get("/v1/jobs/{job_id}/events")
    def events(job_id: JobId, response: Response, team: str = Depends(team_of),
               kind: Annotated[str | None, Query(max_length=40, pattern=r"^[a-z_]+$",
                                                 description="only events of this kind, e.g. transition")] = None,
               limit: Limit = DEFAULT_PAGE,
               after: Annotated[int | None, Query(ge=0, le=MAX_EVENT_ID,
                                                  description="the last event of the page before")] = None,
               ) -> list[dict[str, Any]]:
        """A job's events (state transitions and what the engine did about it), oldest first, a page at a time."""
        with store.transaction() as s:
            job = s.get(JobRow, job_id)
            if job is None:
                raise HTTPException(status.HTTP_404_NOT_FOUND, f"no job {job_id!r}")
            if job.team != team:
                raise HTTPException(status.HTTP_403_FORBIDDEN, f"job {job_id!r} belongs to another team")
            query = select(JobEventRow).where(JobEventRow.job_id == job_id).order_by(JobEventRow.id)
            if kind is not None:
                query = query.where(JobEventRow.kind == kind)
            if after is not None:
                query = query.where(JobEventRow.id > after)
            rows = _next(response, list(s.scalars(query.limit(limit + 1))), limit, lambda r: r.id)
            return [{"id": r.id, "at": r.at.isoformat(), "kind": r.kind, "from_state": r.from_state,
                     "to_state": r.to_state, "detail": r.detail} for r in rows]

    return router
