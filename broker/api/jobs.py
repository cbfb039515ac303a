"""``/v1/jobs``: submit, list, status, cancel and logs, each limited to the caller's team.

Any replica serves these: a submission only writes a PENDING job (the leader's engine takes it
from there) and a cancel only marks the job (the leader tears its clusters down).
"""

from __future__ import annotations

import dataclasses
import logging
import re
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Annotated, Any

from fastapi import APIRouter, Depends, HTTPException, Query, Request, Response, status
from fastapi import Path as PathParam
from fastapi.responses import JSONResponse
from pydantic import AfterValidator, BaseModel, Field
from pydantic_core import to_json
from sqlalchemy import and_, or_, select
from sqlalchemy.exc import IntegrityError

from broker.api.idempotency import REPLAYED_HEADER, earlier, idempotency_key, remember, request_digest
from broker.api.limits import out_of_time
from broker.api.validation import Document, PlainLine, body_schema, job_state, json_body, no_nul, plain_line_of
from broker.clock import Clock
from broker.engine.machine import Within, cancel_job
from broker.intake import Intake, market_problem, read_job
from broker.intake import submit as intake_submit
from broker.service.timepolicy import priority_for, queue_of
from broker.spec.job import JobSpec, Pipeline, SpecError
from broker.spec.yaml_lines import SURROGATE_PROBLEM, lone_surrogate
from broker.status.joblogs import read_new
from broker.status.orm_source import job_summary
from broker.status.page_reads import JOB, JOBS
from broker.status.page_source import page_summaries
from broker.store import Store
from broker.store.tables import JobRow

log = logging.getLogger(__name__)


def _surrogate_in_job_file(text: str) -> tuple[tuple[str | int, ...], str]:
    """The job file's field holding its first lone surrogate, and the message naming its line."""
    found = lone_surrogate(text)
    field, line = found if found is not None else (None, None)
    return tuple(field.split(".")) if field else (), f"line {line}: {SURROGATE_PROBLEM}"


JobFileText = Annotated[str, AfterValidator(no_nul), Document(_surrogate_in_job_file)]


class JobSubmission(BaseModel):
    spec: JobFileText = Field(min_length=1, max_length=1_000_000, description="the job file's text (YAML)")
    source: PlainLine | None = Field(None, max_length=4096,
                                description="the job file's path; a relative workdir is resolved against it")


submission_body = json_body(JobSubmission)
# Job ids are ``j-`` and 8 hex digits; the column holds 32 characters.
CURSOR = r"^[A-Za-z0-9_.-]+$"  # a job's, pipeline's or cluster's id, as a cursor or a filter
JobId = Annotated[str, PathParam(max_length=32, pattern=CURSOR)]
# The widest integer every store takes (PostgreSQL's INTEGER).
MAX_STORED_INT = 2**31 - 1
# Jobs per page of ``GET /v1/jobs``: by default, and at most.
DEFAULT_PAGE = 50
MAX_PAGE = 1000
# A log offset past this is no file's; seeking there overflows.
MAX_LOG_OFFSET = 2**53
# Bytes of output per ``GET /v1/jobs/{id}/logs`` answer, all files together: by default, and at most.
DEFAULT_LOG_PAGE = 1 << 20
MAX_LOG_PAGE = 8 << 20


class CancelResult(BaseModel):
    job_id: str
    state: str


class LogChunkOut(BaseModel):
    file: str
    start: int
    end: int
    text: str


class JobLogs(BaseModel):
    job_id: str
    state: str
    chunks: list[LogChunkOut]


def spec_error_response(exc: SpecError, stage: int | None = None) -> JSONResponse:
    """422 naming the field (``loc``: body, spec, [stage N,] the field's path) and the line."""
    stage = stage or _stage_of(exc.source)
    where = ["stage", stage] if stage is not None else []
    field = exc.field.split(".") if exc.field else []
    return JSONResponse(status_code=status.HTTP_422_UNPROCESSABLE_CONTENT, content={"detail": [{
        "loc": ["body", "spec", *where, *field], "msg": exc.detail, "type": "job_file", "line": exc.line,
    }], "message": str(exc)})


def _stage_of(source: str | None) -> int | None:
    """The stage a pipeline's error is about: its source ends ``(stage N)`` (``broker.spec.pipeline``)."""
    match = re.search(r"\(stage (\d+)\)$", source or "")
    return int(match.group(1)) if match else None


def _row_problem(spec: JobSpec, now: datetime) -> SpecError | None:
    """What the store's columns cannot hold, found before the database sees it (PostgreSQL refuses
    what SQLite would take, and an error from the database would be a 500)."""
    if len(spec.name) > 200:
        return SpecError(f"at most 200 characters, got {len(spec.name)}", field="name")
    for field, number in (("num_nodes", spec.num_nodes), ("broker.priority", spec.broker.priority),
                          ("resources.accelerators", spec.gpus_per_node)):
        if not -MAX_STORED_INT <= number <= MAX_STORED_INT:
            return SpecError(f"{number} is out of range (at most {MAX_STORED_INT})", field=field)
    if spec.accelerator is not None and len(spec.accelerator) > 50:
        return SpecError("accelerator name longer than 50 characters", field="resources.accelerators")
    try:
        deadline = spec.broker.deadline_at(now)
    except OverflowError:
        deadline = datetime.max.replace(tzinfo=UTC)
    if deadline is not None and deadline.year > 9000:
        return SpecError("too far in the future", field="broker.deadline")
    if spec.broker.work is not None and spec.broker.work.days > 365 * 1000:
        return SpecError("too long", field="broker.work")
    texts = {"name": spec.name, "broker.team": spec.broker.team, "broker.checkpoint.dir": spec.broker.checkpoint.dir,
             "resources.accelerators": spec.accelerator}
    for field, text in texts.items():
        if text is not None and "\x00" in text:
            return SpecError("contains a NUL byte", field=field)
    return None


def read_submission(body: JobSubmission, intake: Intake, store: Store, *,
                    pipeline: bool) -> JobSpec | Pipeline | JSONResponse:
    """The submitted job file, read as ``broker launch`` reads it; a 422 naming the field if it cannot be.
    ``pipeline``: a multi-document file is what is wanted (else one task is); ``broker.intake.read_job``
    reads it."""
    source = body.source or "job file"
    try:
        loaded = read_job(body.spec, source, intake, store)
    except SpecError as exc:
        return spec_error_response(exc)
    except Exception as exc:  # whatever the parser trips on is the file's fault, not a 500
        log.warning("job file refused: the parser raised %s", type(exc).__name__)
        said = " ".join(str(exc).split())[:200]
        return spec_error_response(SpecError(f"the job file cannot be read: {type(exc).__name__}: {said}"))
    if isinstance(loaded, Pipeline) and not pipeline:
        what = "job group" if loaded.kind == "group" else "pipeline"
        names = ", ".join(stage.name for stage in loaded.stages)
        return spec_error_response(SpecError(
            f"a {what} of {len(loaded.stages)} stages ({names}): its stages are valid, but this route takes one "
            f"task; POST /v1/pipelines takes a {what}", source=source))
    if isinstance(loaded, JobSpec) and pipeline:
        return spec_error_response(SpecError(
            "one task, not a pipeline (a file of several YAML documents); POST /v1/jobs takes it", source=source))
    return loaded


def refusal(spec: JobSpec, team: str, clock: Clock, intake: Intake, stage: int | None = None) -> JSONResponse | None:
    """A 422 for what the store or the market can never hold, a 403 for a file naming another team."""
    problem = _row_problem(spec, clock.now()) or market_problem(spec, intake)
    if problem is not None:
        if stage is not None and problem.source is None:
            problem = SpecError(problem.detail, field=problem.field, line=problem.line, source=spec.source)
        return spec_error_response(problem, stage)
    if "team" in spec.broker_config and spec.broker.team != team:
        where = f"stage {stage}: " if stage is not None else ""
        raise HTTPException(status.HTTP_403_FORBIDDEN, f"{where}broker.team: the job file names team "
                                                       f"{spec.broker.team!r}, the token is {team!r}'s")
    return None


def check_time(request: Request) -> None:
    if out_of_time(request.state):
        raise HTTPException(status.HTTP_503_SERVICE_UNAVAILABLE,
                            "the request's time budget ran out before the job was stored; nothing was stored")


def for_team(store: Store, spec: JobSpec, team: str) -> JobSpec:
    """The spec as queued: the token's team, and its queue's priority at this time of day if one is set."""
    with store.transaction() as s:
        priority = priority_for(s, queue_of(spec.to_data()))
    section = dataclasses.replace(spec.broker, team=team,
                                  priority=spec.broker.priority if priority is None else priority)
    return dataclasses.replace(spec, broker=section)


class Keyed:
    """A submission's ``Idempotency-Key`` (``broker.api.idempotency``): the jobs an earlier request with
    it stored, or what stores it with the new ones."""

    def __init__(self, store: Store, request: Request, team: str, route: str, body: JobSubmission) -> None:
        self.store, self.team, self.route = store, team, route
        self.key = idempotency_key(request)
        self.digest = request_digest(route, body.spec, body.source) if self.key else ""

    def earlier(self, response: Response) -> dict[str, Any] | None:
        if self.key is None:
            return None
        found = earlier(self.store, self.team, self.key, self.route, self.digest)
        if found is not None:
            response.headers[REPLAYED_HEADER] = "true"
        return found

    def submit(self, response: Response, submit: Callable[[Within | None], list[str]], **extra: str) -> list[str]:
        """``submit``'s job ids, or, when a request with the same key stored its jobs meanwhile, those."""
        if self.key is None:
            return submit(None)
        try:
            return submit(remember(self.team, self.key, self.route, self.digest, **extra))
        except IntegrityError:
            found = self.earlier(response)
            if found is None:
                raise
            return [str(job_id) for job_id in found["job_ids"]]


def jobs_router(store: Store, clock: Clock, intake: Intake, team_of: Any) -> APIRouter:
    router = APIRouter(prefix="/v1/jobs", tags=["jobs"])

    def owned(s: Any, job_id: str, team: str) -> JobRow:
        job = s.get(JobRow, job_id)
        if job is None:
            raise HTTPException(status.HTTP_404_NOT_FOUND, f"no job {job_id!r}")
        if job.team != team:
            raise HTTPException(status.HTTP_403_FORBIDDEN, f"job {job_id!r} belongs to another team")
        return job  # type: ignore[no-any-return]

    @router.post("", status_code=status.HTTP_201_CREATED, responses={422: {"description": "invalid job file"}},
                 openapi_extra=body_schema(JobSubmission))
    def submit(request: Request, response: Response, *, team: str = Depends(team_of),
               body: Annotated[JobSubmission, Depends(submission_body)]) -> Any:
        """Validate a job file and queue it as PENDING for the caller's team. With an ``Idempotency-Key``
        header, a request sent again with the same key (within a day) answers with the job the first one
        stored (header ``Idempotent-Replayed: true``) instead of storing another."""
        keyed = Keyed(store, request, team, "jobs", body)
        if (done := keyed.earlier(response)) is not None:
            with store.transaction() as s:
                return job_summary(s, owned(s, str(done["job_ids"][0]), team), clock_now=clock.now())
        loaded = read_submission(body, intake, store, pipeline=False)
        if isinstance(loaded, JSONResponse):
            return loaded
        assert isinstance(loaded, JobSpec)
        if (refused := refusal(loaded, team, clock, intake)) is not None:
            return refused
        check_time(request)
        (job_id,) = keyed.submit(response, lambda within: intake_submit(
            store, clock, intake, loaded, queued=lambda spec: for_team(store, spec, team), within=within))
        with store.transaction() as s:
            return job_summary(s, owned(s, job_id, team), clock_now=clock.now())

    @router.get("", response_model=list[dict[str, Any]])
    def list_jobs(team: str = Depends(team_of),
                  state: Annotated[str | None, Query(description="only jobs in this state", max_length=20)] = None,
                  name: Annotated[str | None, Query(description="only jobs of this name", max_length=200)] = None,
                  pipeline: Annotated[str | None, Query(description="only the stages of this pipeline",
                                                        max_length=32, pattern=CURSOR)] = None,
                  limit: Annotated[int, Query(ge=1, le=MAX_PAGE, description="jobs per page")] = DEFAULT_PAGE,
                  after: Annotated[str | None, Query(max_length=32, pattern=CURSOR,
                                                     description="the last job of the page before")] = None,
                  order: Annotated[str, Query(pattern=r"^(asc|desc)$",
                                              description="asc: oldest first; desc: newest first")] = "asc",
                  ) -> Response:
        """The caller's team's jobs, oldest first (``order=desc``: newest first), a page at a time: the next
        page is ``after`` the last job of this one (its id is also in the ``X-Next-After`` header when there
        are more). Oldest first, jobs added meanwhile come after every job listed, so paging never skips or
        repeats one; newest first, they are ahead of the first page and paging goes on where it was."""
        with store.transaction() as s:
            newest = order == "desc"
            query = (select(*JOB).where(JOBS.team == team)  # the columns a summary reads, as rows
                     .order_by(*((JOBS.created_at.desc(), JOBS.id.desc()) if newest
                                 else (JOBS.created_at, JOBS.id))))
            if state is not None:
                query = query.where(JOBS.state == job_state(state))
            if name is not None:
                query = query.where(JOBS.name == plain_line_of(name, "name"))
            if pipeline is not None:
                query = query.where(JOBS.pipeline_id == pipeline)
            if after is not None:
                last = s.execute(select(JOBS.team, JOBS.created_at, JOBS.id).where(JOBS.id == after)).first()
                if last is None or last.team != team:
                    raise HTTPException(status.HTTP_422_UNPROCESSABLE_CONTENT,
                                        f"after: no job {after!r} of team {team!r} to list from")
                query = query.where(
                    or_(JOBS.created_at < last.created_at,
                        and_(JOBS.created_at == last.created_at, JOBS.id < last.id)) if newest else
                    or_(JOBS.created_at > last.created_at,
                        and_(JOBS.created_at == last.created_at, JOBS.id > last.id)))
            page = s.execute(query.limit(limit + 1)).all()
            headers = {}
            if len(page) > limit:
                page = page[:limit]
                headers["X-Next-After"] = page[-1].id
            # Already JSON's types: written as they are, without the pass FastAPI makes to validate and
            # convert a returned value first (about half a millisecond of a page of 50).
            return Response(to_json(page_summaries(s, page, clock_now=clock.now())), headers=headers,
                            media_type="application/json")

    @router.get("/{job_id}")
    def get_job(job_id: JobId, team: str = Depends(team_of)) -> dict[str, Any]:
        """One job: the fields of `broker status JOB --json`."""
        with store.transaction() as s:
            return job_summary(s, owned(s, job_id, team), clock_now=clock.now())

    @router.post("/{job_id}/cancel", response_model=CancelResult)
    def cancel(job_id: JobId, team: str = Depends(team_of)) -> CancelResult:
        """Cancel a job; the leader's engine tears its clusters down on its next step."""
        with store.transaction() as s:
            owned(s, job_id, team)
        return CancelResult(job_id=job_id, state=cancel_job(store, job_id, clock))

    @router.get("/{job_id}/logs", response_model=JobLogs)
    def logs(job_id: JobId, team: str = Depends(team_of),
             offset: Annotated[list[str] | None, Query(description="FILE:BYTES already read, repeatable")] = None,
             max_bytes: Annotated[int, Query(ge=1, le=MAX_LOG_PAGE, description="bytes per answer, all files")]
             = DEFAULT_LOG_PAGE,
             ) -> JobLogs:
        """New output of every attempt and node, past the offsets the caller already has: at most
        ``max_bytes`` in all, the files in order (attempt, then node); the next page is asked with the
        offsets this one ends at, until an answer has no chunk."""
        offsets: dict[str, int] = {}
        if len(offset or []) > 1000:
            raise HTTPException(status.HTTP_422_UNPROCESSABLE_CONTENT, "offset: at most 1000 of them")
        for item in offset or []:
            name, _, number = item.rpartition(":")
            if (not name or len(item) > 300 or not number.isascii() or not number.isdigit()
                    or len(number) > 16 or int(number) > MAX_LOG_OFFSET):
                raise HTTPException(status.HTTP_422_UNPROCESSABLE_CONTENT,
                                    f"offset: expected FILE:BYTES like attempt-1-node-0:1024 with BYTES at most "
                                    f"{MAX_LOG_OFFSET}, got {item[:80]!r}")
            offsets[name] = int(number)
        with store.transaction() as s:
            job = owned(s, job_id, team)
            state = job.state
        chunks = read_new(intake.home, job_id, offsets, total=max_bytes)
        return JobLogs(job_id=job_id, state=state, chunks=[LogChunkOut(**dataclasses.asdict(c)) for c in chunks])

    return router
