"""When will each running job finish: the prediction policy asked with what the store knows, and kept.

``predict_job`` builds the policy's request from the job's progress reports (``progress_reports``),
its stated work and the run times of earlier jobs of the same name and team, and asks
``policies.prediction``. ``record`` keeps a prediction per running job at most every
``RECORD_EVERY`` of market time (``predictions``), so ``status`` can show the latest one without a
clock, and later how far off the predictions of finished jobs were.
"""

from __future__ import annotations

from collections import defaultdict
from datetime import datetime, timedelta

from sqlalchemy import Select, func, select
from sqlalchemy.orm import Session

from broker.engine.checkpoints import progress_s
from broker.model import JobState
from broker.store import Store
from broker.store.tables import AllocationRow, JobRow, PredictionRow, ProgressRow
from policies.prediction import Prediction, PredictionRequest, ProgressPoint, predict

RECORD_EVERY = timedelta(seconds=30)
MAX_POINTS = 400  # the latest progress reports a prediction reads (bounded memory per job)
MAX_HISTORY = 200  # earlier jobs of the same name and team
CHUNK = 500  # ids per IN (...) list
PER_STEP = 200  # jobs a step predicts at most (the engine's step): the rest in the next steps


class Reads:
    """What ``record`` reads for all the jobs it predicts at once (a few statements, not a few per job):
    their progress reports, the allocations ``progress_s`` sums, and each name and team's earlier jobs."""

    def __init__(self, s: Session, jobs: list[JobRow], now: datetime) -> None:
        self.s, self.now = s, now
        self.points: dict[str, list[ProgressRow]] = defaultdict(list)
        ids = [job.id for job in jobs]
        rank = func.row_number().over(partition_by=ProgressRow.job_id,
                                      order_by=(ProgressRow.at.desc(), ProgressRow.id.desc())).label("rank")
        for chunk in range(0, len(ids), CHUNK):
            ranked = select(ProgressRow.id, rank).where(ProgressRow.job_id.in_(ids[chunk:chunk + CHUNK])).subquery()
            for row in s.scalars(select(ProgressRow).join(ranked, ranked.c.id == ProgressRow.id)
                                 .where(ranked.c.rank <= MAX_POINTS)
                                 .order_by(ProgressRow.at.desc(), ProgressRow.id.desc())):
                self.points[row.job_id].append(row)
        self.history: dict[tuple[str, str], list[JobRow]] = {}
        # name and team -> (job -> its place among the first MAX_HISTORY, (succeeded, run time) of each)
        self.split: dict[tuple[str, str], tuple[dict[str, int], list[tuple[bool, float]]]] = {}
        self.allocations: dict[str, list[AllocationRow]] = {}
        self.progress: dict[str, float] = {}
        self._allocations_of(ids)  # every predicted job's own run time, at once

    def progress_rows(self, job: JobRow) -> list[ProgressRow]:
        return self.points.get(job.id, [])

    def earlier(self, job: JobRow) -> list[JobRow]:
        key = (job.name, job.team)
        if key not in self.history:  # one more than kept: the job itself may be among them
            self.history[key] = list(self.s.scalars(_history_query(job).limit(MAX_HISTORY + 1)))
            self._allocations_of([j.id for j in self.history[key]])
        return [other for other in self.history[key] if other.id != job.id][:MAX_HISTORY]

    def earlier_s(self, job: JobRow) -> tuple[tuple[float, ...], tuple[float, ...]]:
        """The run times of ``earlier(job)``: (finished ones, ones still running), in its order, from the
        name and team's history summed once: a job outside its first ``MAX_HISTORY`` (most of them, with
        thousands running) sees those; a job among them sees them without itself, and the next one."""
        key = (job.name, job.team)
        if key not in self.split:
            self.earlier(job)  # the name and team's history, read
            history = self.history[key][:MAX_HISTORY + 1]
            self.split[key] = ({other.id: i for i, other in enumerate(history[:MAX_HISTORY])},
                               [(other.state == JobState.SUCCEEDED.value, self.progress_s(other)) for other in history])
        within, rows = self.split[key]
        at = within.get(job.id)
        kept = rows[:MAX_HISTORY] if at is None else (rows[:at] + rows[at + 1:])[:MAX_HISTORY]
        return tuple(ran for done, ran in kept if done), tuple(ran for done, ran in kept if not done)

    def progress_s(self, job: JobRow) -> float:
        """Summed once per job and pass: each job is an earlier job of every other of its name and team."""
        if job.id not in self.progress:
            self._allocations_of([job.id])
            done = sum(max(((a.ended_at or self.now) - (a.running_at or a.started_at)).total_seconds(), 0.0)
                       for a in self.allocations[job.id])
            self.progress[job.id] = max(done - job.work_lost_s, 0.0)
        return self.progress[job.id]

    def _allocations_of(self, job_ids: list[str]) -> None:
        missing = [j for j in job_ids if j not in self.allocations]
        for job_id in missing:
            self.allocations[job_id] = []
        for chunk in range(0, len(missing), CHUNK):
            wanted = missing[chunk:chunk + CHUNK]
            for alloc in self.s.scalars(select(AllocationRow).where(AllocationRow.job_id.in_(wanted))
                                        .order_by(AllocationRow.id)):
                self.allocations[alloc.job_id].append(alloc)


def _history_query(job: JobRow) -> Select[JobRow]:
    return (select(JobRow).where(JobRow.name == job.name, JobRow.team == job.team,
                                 JobRow.state.in_([JobState.SUCCEEDED.value, JobState.RUNNING.value]))
            .order_by(JobRow.created_at.desc()))


def prediction_request(s: Session, job: JobRow, now: datetime, reads: Reads | None = None) -> PredictionRequest:
    if reads is not None:
        rows = list(reads.progress_rows(job))
    else:
        rows = list(s.scalars(select(ProgressRow).where(ProgressRow.job_id == job.id)
                              .order_by(ProgressRow.at.desc(), ProgressRow.id.desc()).limit(MAX_POINTS)))
    rows.reverse()
    total = next((r.total for r in reversed(rows) if r.total), None)
    points = tuple(ProgressPoint((r.at - now).total_seconds(), int(r.step), r.attempt) for r in rows)
    if reads is not None:
        history_s, running_s = reads.earlier_s(job)
        ran = reads.progress_s(job)
    else:
        finished: list[float] = []
        running: list[float] = []
        for other in s.scalars(_history_query(job).where(JobRow.id != job.id).limit(MAX_HISTORY)):
            (finished if other.state == JobState.SUCCEEDED.value else running).append(progress_s(s, other, now))
        history_s, running_s = tuple(finished), tuple(running)
        ran = progress_s(s, job, now)
    return PredictionRequest(now_s=0.0, total_steps=int(total) if total else None, progress=points,
                             work_s=job.work_s, ran_s=ran, history_s=history_s, running_s=running_s)


def predict_job(s: Session, job: JobRow, now: datetime) -> Prediction | None:
    """The job's remaining time (market seconds from ``now``) with its interval, or None if nothing says."""
    return predict(prediction_request(s, job, now))


def latest(s: Session, job_id: str) -> PredictionRow | None:
    return s.scalar(select(PredictionRow).where(PredictionRow.job_id == job_id)
                    .order_by(PredictionRow.made_at.desc(), PredictionRow.id.desc()).limit(1))


def _latest_of(s: Session, job_ids: list[str]) -> dict[str, tuple[int, datetime]]:
    """``latest`` for many jobs at once: job -> (attempt, made_at) of its newest prediction."""
    rank = func.row_number().over(partition_by=PredictionRow.job_id,
                                  order_by=(PredictionRow.made_at.desc(), PredictionRow.id.desc())).label("rank")
    found: dict[str, tuple[int, datetime]] = {}
    for chunk in range(0, len(job_ids), CHUNK):
        ranked = (select(PredictionRow.job_id, PredictionRow.attempt, PredictionRow.made_at, rank)
                  .where(PredictionRow.job_id.in_(job_ids[chunk:chunk + CHUNK])).subquery())
        found.update({job_id: (attempt, made_at) for job_id, attempt, made_at in s.execute(
            select(ranked.c.job_id, ranked.c.attempt, ranked.c.made_at).where(ranked.c.rank == 1))})
    return found


def record(store: Store, now: datetime, unknown: dict[str, tuple[int, datetime]] | None = None,
           limit: int | None = None) -> int:
    """Keep a fresh prediction for every running job whose last one is older than ``RECORD_EVERY``;
    returns the jobs tried.

    ``limit`` (the engine's step: ``PER_STEP``): at most that many, those tried longest ago first (never
    tried, first of all), the rest left to the next calls: thousands of jobs that started together,
    all due in the same 30 s, are spread over steps.

    ``unknown`` (kept by the caller between calls; a cache, empty after a restart): job -> (attempt, when)
    of its last try that nothing could predict (no progress, stated work or finished history yet); such
    a job is tried again ``RECORD_EVERY`` later, as a predicted one is, not on every call."""
    with store.transaction() as s:
        attempts = dict(s.execute(select(JobRow.id, JobRow.attempt).where(JobRow.state == JobState.RUNNING.value))
                        .all())
        last = _latest_of(s, list(attempts))
        if unknown is not None:
            last.update({job_id: tried for job_id, tried in unknown.items() if job_id not in last
                         or tried[1] > last[job_id][1]})
            for job_id in [j for j in unknown if j not in attempts]:
                del unknown[job_id]
        stale = sorted(((job_id in last, last[job_id][1] if job_id in last else now, job_id)
                        for job_id, attempt in attempts.items()
                        if not (job_id in last and last[job_id][0] == attempt
                                and now - last[job_id][1] < RECORD_EVERY)))
        wanted = sorted(job_id for _, _, job_id in (stale if limit is None else stale[:limit]))
        if not wanted:
            return 0
        due: list[JobRow] = []
        for chunk in range(0, len(wanted), CHUNK):
            due += s.scalars(select(JobRow).where(JobRow.id.in_(wanted[chunk:chunk + CHUNK])))
        due.sort(key=lambda job: job.id)
        reads = Reads(s, due, now)
        for job in due:
            found = predict(prediction_request(s, job, now, reads))
            if found is None:
                if unknown is not None:
                    unknown[job.id] = (job.attempt, now)
                continue
            s.add(PredictionRow(job_id=job.id, attempt=job.attempt, made_at=now, source=found.source,
                                finish_at=now + timedelta(seconds=found.remaining_s),
                                low_at=now + timedelta(seconds=found.low_s),
                                high_at=now + timedelta(seconds=found.high_s)))
        return len(due)
