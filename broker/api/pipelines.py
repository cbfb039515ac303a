"""``/v1/pipelines``: submit a multi-document job file (a chain of stages, or a job group).

Every stage is judged as ``POST /v1/jobs`` judges a job (the parser, the store's columns, the
market, the token's team), and only when all pass are they recorded, in one transaction, by
``broker.intake.submit``: a refused stage stores nothing. The stages are jobs from then on
(``GET /v1/jobs`` lists them with their ``pipeline_id`` and ``stage``).
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Depends, Request, Response, status
from fastapi.responses import JSONResponse
from sqlalchemy import select

from broker.api.jobs import (
    JobSubmission,
    Keyed,
    check_time,
    for_team,
    read_submission,
    refusal,
    submission_body,
)
from broker.api.validation import body_schema
from broker.clock import Clock
from broker.intake import Intake
from broker.intake import submit as intake_submit
from broker.spec.job import Pipeline
from broker.status.orm_source import job_summary
from broker.store import Store
from broker.store.tables import JobRow


def pipelines_router(store: Store, clock: Clock, intake: Intake, team_of: Any) -> APIRouter:
    router = APIRouter(prefix="/v1/pipelines", tags=["jobs"])

    @router.post("", status_code=status.HTTP_201_CREATED,
                 responses={422: {"description": "invalid job file, or a stage of it"}},
                 openapi_extra=body_schema(JobSubmission))
    def submit(request: Request, response: Response, *, team: str = Depends(team_of),
               body: Annotated[JobSubmission, Depends(submission_body)]) -> Any:
        """Validate a pipeline or job group and queue its stages as PENDING jobs of the caller's team:
        201 with ``pipeline_id``, ``name``, ``kind`` (chain or group), ``job_ids`` and each stage's summary.
        An ``Idempotency-Key`` works as on ``POST /v1/jobs``."""
        keyed = Keyed(store, request, team, "pipelines", body)
        if (done := keyed.earlier(response)) is not None:
            return answer([str(job_id) for job_id in done["job_ids"]], str(done["name"]), str(done["kind"]))
        loaded = read_submission(body, intake, store, pipeline=True)
        if isinstance(loaded, JSONResponse):
            return loaded
        assert isinstance(loaded, Pipeline)
        for number, stage in enumerate(loaded.stages, start=1):
            if (refused := refusal(stage, team, clock, intake, stage=number)) is not None:
                return refused
        check_time(request)
        job_ids = keyed.submit(response, lambda within: intake_submit(
            store, clock, intake, loaded, queued=lambda stage: for_team(store, stage, team), within=within),
            name=loaded.name, kind=loaded.kind)
        return answer(job_ids, loaded.name, loaded.kind)

    def answer(job_ids: list[str], name: str, kind: str) -> dict[str, Any]:
        with store.transaction() as s:
            rows = list(s.scalars(select(JobRow).where(JobRow.id.in_(job_ids)).order_by(JobRow.stage)))
            return {"pipeline_id": rows[0].pipeline_id, "name": name, "kind": kind,
                    "job_ids": job_ids, "stages": [job_summary(s, row, clock_now=clock.now()) for row in rows]}

    return router
