"""When will each running job finish: the prediction policy asked with what the store knows, and kept.

``predict_job`` builds the policy's request from the job's progress reports (``progress_reports``),
its stated work and the run times of earlier jobs of the same name and team, and asks
``policies.prediction``. ``record`` keeps a prediction per running job at most every
``RECORD_EVERY`` of market time (``predictions``), so ``status`` can show the latest one without a
clock, and later how far off the predictions of finished jobs were.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from sqlalchemy import select
from sqlalchemy.orm import Session

from broker.engine.checkpoints import progress_s
from broker.model import JobState
from broker.store import Store
from broker.store.tables import JobRow, PredictionRow, ProgressRow
from policies.prediction import Prediction, PredictionRequest, ProgressPoint, predict

RECORD_EVERY = timedelta(seconds=30)
MAX_POINTS = 400  # the latest progress reports a prediction reads (bounded memory per job)
MAX_HISTORY = 200  # earlier jobs of the same name and team


def prediction_request(s: Session, job: JobRow, now: datetime) -> PredictionRequest:
    rows = list(s.scalars(select(ProgressRow).where(ProgressRow.job_id == job.id)
                          .order_by(ProgressRow.at.desc(), ProgressRow.id.desc()).limit(MAX_POINTS)))
    rows.reverse()
    total = next((r.total for r in reversed(rows) if r.total), None)
    points = tuple(ProgressPoint((r.at - now).total_seconds(), int(r.step), r.attempt) for r in rows)
    finished: list[float] = []
    running: list[float] = []
    earlier = s.scalars(select(JobRow).where(JobRow.name == job.name, JobRow.team == job.team, JobRow.id != job.id,
                                             JobRow.state.in_([JobState.SUCCEEDED.value, JobState.RUNNING.value]))
                        .order_by(JobRow.created_at.desc()).limit(MAX_HISTORY))
    for other in earlier:
        (finished if other.state == JobState.SUCCEEDED.value else running).append(progress_s(s, other, now))
    return PredictionRequest(now_s=0.0, total_steps=int(total) if total else None, progress=points,
                             work_s=job.work_s, ran_s=progress_s(s, job, now),
                             history_s=tuple(finished), running_s=tuple(running))


def predict_job(s: Session, job: JobRow, now: datetime) -> Prediction | None:
    """The job's remaining time (market seconds from ``now``) with its interval, or None if nothing says."""
    return predict(prediction_request(s, job, now))


def latest(s: Session, job_id: str) -> PredictionRow | None:
    return s.scalar(select(PredictionRow).where(PredictionRow.job_id == job_id)
                    .order_by(PredictionRow.made_at.desc(), PredictionRow.id.desc()).limit(1))


def record(store: Store, now: datetime) -> None:
    """Keep a fresh prediction for every running job whose last one is older than ``RECORD_EVERY``."""
    with store.transaction() as s:
        for job in s.scalars(select(JobRow).where(JobRow.state == JobState.RUNNING.value)):
            last = latest(s, job.id)
            if last is not None and last.attempt == job.attempt and now - last.made_at < RECORD_EVERY:
                continue
            found = predict_job(s, job, now)
            if found is None:
                continue
            s.add(PredictionRow(job_id=job.id, attempt=job.attempt, made_at=now, source=found.source,
                                finish_at=now + timedelta(seconds=found.remaining_s),
                                low_at=now + timedelta(seconds=found.low_s),
                                high_at=now + timedelta(seconds=found.high_s)))
