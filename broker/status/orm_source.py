"""The reads of a job's summary (``broker.status.summary``) in a SQLAlchemy session: every store, any dialect."""

from __future__ import annotations

from datetime import datetime
from typing import TYPE_CHECKING, Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from broker.status.summary import summarise
from broker.store.gpu import GpuRollupRow
from broker.store.tables import AllocationRow, ClusterRow, JobRow, LedgerRow, PredictionRow, ProgressRow

if TYPE_CHECKING:
    from broker.status.progress import Span
    from broker.status.summary import Allocation, Cluster, Job, Prediction, Progress


class SessionSource:
    """``broker.status.summary.SummarySource`` over a session; ``broker.status.readonly`` asks SQLite the same."""

    def __init__(self, s: Session) -> None:
        self.s = s
        self.memo: dict[str, Any] = s.info  # lives as long as the session, like its identity map

    def jobs(self, state: str | None = None, newest: int | None = None) -> list[Job]:
        query = select(JobRow) if state is None else select(JobRow).where(JobRow.state == state)
        if newest is None:
            return list(self.s.scalars(query.order_by(JobRow.created_at)))
        return list(reversed(self.s.scalars(query.order_by(JobRow.created_at.desc(), JobRow.id.desc())
                                            .limit(newest)).all()))

    def job(self, job_id: str) -> Job | None:
        return self.s.get(JobRow, job_id)

    def costs(self, job_id: str) -> tuple[float, float]:
        cost, on_demand = self.s.execute(
            select(func.coalesce(func.sum(LedgerRow.cost), 0.0), func.coalesce(func.sum(LedgerRow.on_demand_cost), 0.0))
            .where(LedgerRow.job_id == job_id)
        ).one()
        return cost, on_demand

    def gpu(self, job_id: str) -> tuple[float, float, float | None]:
        measured, utilization, peak = self.s.execute(
            select(func.coalesce(func.sum(GpuRollupRow.measured_seconds), 0.0),
                   func.coalesce(func.sum(GpuRollupRow.utilization_seconds), 0.0),
                   func.max(GpuRollupRow.peak_memory_mb))
            .where(GpuRollupRow.job_id == job_id)).one()
        return float(measured), float(utilization), peak

    def last_allocation(self, job_id: str) -> Allocation | None:
        return self.s.scalar(select(AllocationRow).where(AllocationRow.job_id == job_id)
                             .order_by(AllocationRow.attempt.desc()).limit(1))

    def cluster(self, cluster_id: str) -> Cluster | None:
        return self.s.get(ClusterRow, cluster_id)

    def newest_cluster_up(self, job_id: str) -> Cluster | None:
        return self.s.scalar(select(ClusterRow).where(ClusterRow.job_id == job_id, ClusterRow.up_at.is_not(None))
                             .order_by(ClusterRow.created_at.desc()))

    def last_progress(self, job_id: str) -> Progress | None:
        return self.s.scalar(select(ProgressRow).where(ProgressRow.job_id == job_id)
                             .order_by(ProgressRow.at.desc(), ProgressRow.id.desc()).limit(1))

    def spans(self, job_id: str) -> list[Span]:
        return [(a, b, c) for a, b, c in self.s.execute(
            select(AllocationRow.started_at, AllocationRow.running_at, AllocationRow.ended_at)
            .where(AllocationRow.job_id == job_id))]

    def last_prediction(self, job_id: str) -> Prediction | None:
        return self.s.scalar(select(PredictionRow).where(PredictionRow.job_id == job_id)
                             .order_by(PredictionRow.made_at.desc(), PredictionRow.id.desc()).limit(1))

    def predictions(self, job_id: str) -> list[Prediction]:
        return list(self.s.scalars(select(PredictionRow).where(PredictionRow.job_id == job_id)))

    def succeeded(self, name: str, team: str, limit: int) -> list[Job]:
        return list(self.s.scalars(select(JobRow).where(JobRow.name == name, JobRow.team == team,
                                                        JobRow.state == "SUCCEEDED")
                                   .order_by(JobRow.finished_at.desc()).limit(limit)))


def job_summary(s: Session, job: JobRow, now: datetime | None = None,
                clock_now: datetime | None = None) -> dict[str, Any]:
    """The summary of a job read in a SQLAlchemy session (``clock_now``: the broker's clock, for estimates)."""
    return summarise(SessionSource(s), job, now, clock_now)
