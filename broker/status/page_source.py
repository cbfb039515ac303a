"""The reads of a page of job summaries in a handful of statements, whatever the page's size.

``SessionSource`` asks the store about one job at a time (eight or so statements per job): right for
``status`` of one job, but a page of 100 jobs cost 900 statements. ``PageSource`` reads the same
rows for every job of the page at once (one statement per kind of row) and answers each of
``broker.status.summary``'s questions from them, so a page's summaries are the ones each job's own
read gives (a test compares them) at a fixed cost per page.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any, NamedTuple, cast

from sqlalchemy import func, select, union_all
from sqlalchemy.orm import Session

from broker.status.orm_source import SessionSource
from broker.status.summary import EARLIER_JOBS, summarise
from broker.store.gpu import GpuRollupRow
from broker.store.tables import AllocationRow, ClusterRow, JobRow, LedgerRow, PredictionRow, ProgressRow

if TYPE_CHECKING:
    from broker.status.progress import Span
    from broker.status.summary import Allocation, Cluster, Job, Prediction, Progress


class Finished(NamedTuple):
    """The columns of an earlier finished job that ``summary._earlier_error`` and ``_errors`` read."""

    id: str
    name: str
    team: str
    state: str
    finished_at: datetime | None


class Made(NamedTuple):
    """The columns of a prediction that ``summary._errors`` reads."""

    made_at: datetime
    finish_at: datetime


class PageSource(SessionSource):
    """``SummarySource`` over the rows of ``jobs`` read in bulk; any other job is asked one at a time."""

    def __init__(self, s: Session, jobs: Sequence[JobRow]) -> None:
        super().__init__(s)
        self.ids = {job.id for job in jobs}
        ids = sorted(self.ids)
        self._costs: dict[str, tuple[float, float]] = {}
        self._gpu: dict[str, tuple[float, float, float | None]] = {}
        self._allocations: dict[str, list[AllocationRow]] = {job_id: [] for job_id in ids}
        self._clusters: dict[str, ClusterRow] = {}
        self._up: dict[str, ClusterRow] = {}
        self._progress: dict[str, ProgressRow] = {}
        self._prediction: dict[str, PredictionRow] = {}
        self._predictions: dict[str, list[Prediction]] = {}
        if ids:
            self._read(ids)
            self._read_earlier(jobs)

    def _read(self, ids: list[str]) -> None:
        s = self.s
        for job_id, cost, on_demand in s.execute(
                select(LedgerRow.job_id, func.coalesce(func.sum(LedgerRow.cost), 0.0),
                       func.coalesce(func.sum(LedgerRow.on_demand_cost), 0.0))
                .where(LedgerRow.job_id.in_(ids)).group_by(LedgerRow.job_id)):
            self._costs[str(job_id)] = (cost, on_demand)
        for job_id, measured, utilization, peak in s.execute(
                select(GpuRollupRow.job_id, func.coalesce(func.sum(GpuRollupRow.measured_seconds), 0.0),
                       func.coalesce(func.sum(GpuRollupRow.utilization_seconds), 0.0),
                       func.max(GpuRollupRow.peak_memory_mb))
                .where(GpuRollupRow.job_id.in_(ids)).group_by(GpuRollupRow.job_id)):
            self._gpu[str(job_id)] = (float(measured), float(utilization), peak)
        for allocation in s.scalars(select(AllocationRow).where(AllocationRow.job_id.in_(ids))):
            self._allocations[allocation.job_id].append(allocation)
        wanted = sorted({max(rows, key=lambda a: a.attempt).cluster_id
                         for rows in self._allocations.values() if rows})
        for cluster in s.scalars(select(ClusterRow).where(
                ClusterRow.id.in_(wanted) | (ClusterRow.job_id.in_(ids) & ClusterRow.up_at.is_not(None)))):
            self._clusters[cluster.id] = cluster
            if cluster.job_id in self.ids and cluster.up_at is not None:
                newest = self._up.get(cluster.job_id)
                if newest is None or cluster.created_at > newest.created_at:
                    self._up[cluster.job_id] = cluster
        self._progress = _latest(s, ProgressRow, ProgressRow.at, ids)
        self._prediction = _latest(s, PredictionRow, PredictionRow.made_at, ids)

    def _read_earlier(self, jobs: Sequence[JobRow]) -> None:
        """The latest finished jobs of each name and team on the page, and the predictions of those and of
        the page's finished jobs (what ``summary._earlier_error`` and ``_errors`` ask for): the columns those
        read, each name and team's jobs found through the (name, team, finished_at) index."""
        cache: dict[tuple[str, str], list[Job]] = self.memo.setdefault("earlier_jobs", {})
        pairs = sorted({(job.name, job.team) for job in jobs} - set(cache))
        wanted = {job.id for job in jobs if job.state == "SUCCEEDED"}
        self._predictions = {}
        if pairs:
            latest = union_all(*(
                select(JobRow.id, JobRow.name, JobRow.team, JobRow.state, JobRow.finished_at)
                .where(JobRow.name == name, JobRow.team == team, JobRow.state == "SUCCEEDED")
                .order_by(JobRow.finished_at.desc()).limit(EARLIER_JOBS + 1).subquery().select()
                for name, team in pairs)).subquery()
            found: dict[tuple[str, str], list[Job]] = {pair: [] for pair in pairs}
            for row in self.s.execute(select(latest).order_by(latest.c.finished_at.desc())):
                found[(row.name, row.team)].append(cast("Job", Finished(row.id, row.name, row.team, row.state,
                                                                        row.finished_at)))
            cache.update(found)
            for job_id, made_at, finish_at in self.s.execute(
                    select(PredictionRow.job_id, PredictionRow.made_at, PredictionRow.finish_at)
                    .join(latest, latest.c.id == PredictionRow.job_id).order_by(PredictionRow.id)):
                self._predictions.setdefault(str(job_id), []).append(cast("Prediction", Made(made_at, finish_at)))
            for pair in pairs:
                for job in found[pair]:
                    self._predictions.setdefault(job.id, [])
        wanted -= set(self._predictions)
        if wanted:
            for job_id, made_at, finish_at in self.s.execute(
                    select(PredictionRow.job_id, PredictionRow.made_at, PredictionRow.finish_at)
                    .where(PredictionRow.job_id.in_(sorted(wanted))).order_by(PredictionRow.id)):
                self._predictions.setdefault(str(job_id), []).append(cast("Prediction", Made(made_at, finish_at)))
            for job_id in wanted:
                self._predictions.setdefault(job_id, [])

    def costs(self, job_id: str) -> tuple[float, float]:
        if job_id not in self.ids:
            return super().costs(job_id)
        return self._costs.get(job_id, (0.0, 0.0))

    def gpu(self, job_id: str) -> tuple[float, float, float | None]:
        if job_id not in self.ids:
            return super().gpu(job_id)
        return self._gpu.get(job_id, (0.0, 0.0, None))

    def last_allocation(self, job_id: str) -> Allocation | None:
        if job_id not in self.ids:
            return super().last_allocation(job_id)
        rows = self._allocations[job_id]
        return max(rows, key=lambda a: a.attempt) if rows else None

    def cluster(self, cluster_id: str) -> Cluster | None:
        return self._clusters.get(cluster_id) or super().cluster(cluster_id)

    def newest_cluster_up(self, job_id: str) -> Cluster | None:
        if job_id not in self.ids:
            return super().newest_cluster_up(job_id)
        return self._up.get(job_id)

    def last_progress(self, job_id: str) -> Progress | None:
        if job_id not in self.ids:
            return super().last_progress(job_id)
        return self._progress.get(job_id)

    def spans(self, job_id: str) -> list[Span]:
        if job_id not in self.ids:
            return super().spans(job_id)
        return [(a.started_at, a.running_at, a.ended_at) for a in self._allocations[job_id]]

    def last_prediction(self, job_id: str) -> Prediction | None:
        if job_id not in self.ids:
            return super().last_prediction(job_id)
        return self._prediction.get(job_id)

    def predictions(self, job_id: str) -> list[Prediction]:
        if job_id not in self._predictions:
            return super().predictions(job_id)
        return list(self._predictions[job_id])


def _latest(s: Session, row: Any, at: Any, ids: list[str]) -> dict[str, Any]:
    """Each job's row with the latest ``at``, the latest id among equal times (``order_by(at desc, id desc)``)."""
    newest = select(row.job_id, func.max(at).label("at")).where(row.job_id.in_(ids)).group_by(row.job_id).subquery()
    found: dict[str, Any] = {}
    for candidate in s.scalars(select(row).join(newest, (newest.c.job_id == row.job_id) & (newest.c.at == at))):
        if candidate.job_id not in found or candidate.id > found[candidate.job_id].id:
            found[candidate.job_id] = candidate
    return found


def page_summaries(s: Session, jobs: Iterable[JobRow], now: datetime | None = None,
                   clock_now: datetime | None = None) -> list[dict[str, Any]]:
    """The summaries of ``jobs`` (``broker.status.orm_source.job_summary`` of each), read in bulk."""
    page = list(jobs)
    source = PageSource(s, page)
    return [summarise(source, job, now, clock_now) for job in page]
