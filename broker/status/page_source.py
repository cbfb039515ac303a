"""The reads of a page of job summaries in a handful of statements, whatever the page's size.

``SessionSource`` asks the store about one job at a time (eight or so statements per job): right for
``status`` of one job, but a page of 100 jobs cost 900 statements. ``PageSource`` reads the same
rows for every job of the page at once (one statement per kind of row) and answers each of
``broker.status.summary``'s questions from them, so a page's summaries are the ones each job's own
read gives (a test compares them) at a fixed cost per page.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Iterable, Sequence
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any, NamedTuple, cast

from sqlalchemy import select
from sqlalchemy.orm import Session

from broker.status.orm_source import SessionSource
from broker.status.page_reads import BRANCHES, LATEST_FINISHED_PG, bucket, latest_finished_by_branch, listed, reads
from broker.status.summary import errors_of, summarise
from broker.store.tables import JobRow, PredictionRow

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


# A finished job's predictions stop changing once the transaction that may have been writing one as it
# finished (``broker.engine.forecast.record``) has ended: this long after its wall-clock finish.
SETTLED = timedelta(minutes=1)
KEPT_JOBS = 50_000  # finished jobs whose prediction errors a process keeps, per store (about 25 MB at most)


class Outside(NamedTuple):
    """What a name and team's latest finished jobs give every other job of theirs, while they stay the latest."""

    ids: tuple[str, ...]  # latest finished first
    error: dict[str, Any] | None  # ``earlier_prediction_error``
    rows: list[Job]  # ``Finished`` rows of ``ids``


class Kept:
    """The prediction errors of finished jobs, kept across requests: each ``SUCCEEDED`` job's
    (finished_at, errors), which no longer change once it has settled (``SETTLED``)."""

    def __init__(self) -> None:
        self._jobs: dict[str, tuple[datetime | None, list[tuple[float, float]]]] = {}
        # A name and team's ``earlier_prediction_error`` for its jobs outside its latest finished ones, the
        # ids of those (all kept) it was summed from and their rows: the same while they stay the latest.
        self.outside: dict[tuple[str, str], Outside] = {}

    def jobs(self) -> dict[str, tuple[datetime | None, list[tuple[float, float]]]]:
        """What is kept now, to read from (a ``put`` that starts again leaves it as it was)."""
        return self._jobs

    def put(self, job_id: str, finished_at: datetime | None, errors: list[tuple[float, float]]) -> None:
        if len(self._jobs) >= KEPT_JOBS:
            self._jobs, self.outside = {}, {}  # rare: started again rather than tracking which to drop
        self._jobs[job_id] = (finished_at, errors)


_KEPT: weakref.WeakKeyDictionary[Any, Kept] = weakref.WeakKeyDictionary()
_KEPT_LOCK = threading.Lock()


def _kept(s: Session) -> Kept:
    return _kept_of(s.get_bind())


def _kept_of(engine: Any) -> Kept:
    """This store's (engine's) kept errors: a test's store and the next one reusing its path share nothing."""
    with _KEPT_LOCK:
        kept = _KEPT.get(engine)
        if kept is None:
            kept = _KEPT[engine] = Kept()
        return kept


class PageSource(SessionSource):
    """``SummarySource`` over the rows of ``jobs`` read in bulk; any other job is asked one at a time."""

    def __init__(self, s: Session, jobs: Sequence[Job]) -> None:
        super().__init__(s)
        self.ids = {job.id for job in jobs}
        self.kept = _kept(s)
        self.settled: dict[tuple[str, str], tuple[str, ...]] = {}  # what to keep of ``earlier_errors``
        ids = sorted(self.ids)
        self._costs: dict[str, tuple[float, float]] = {}
        self._gpu: dict[str, tuple[float, float, float | None]] = {}
        self._allocations: dict[str, list[Any]] = {job_id: [] for job_id in ids}
        self._clusters: dict[str, Any] = {}
        self._up: dict[str, Any] = {}
        self._progress: dict[str, Any] = {}
        self._prediction: dict[str, Any] = {}
        if ids:
            self._read(ids)
            self._read_earlier(jobs)

    def _read(self, ids: list[str]) -> None:
        s = self.s
        postgres = s.get_bind().dialect.name == "postgresql"
        statements = reads(postgres)
        params = {"ids": listed(ids, postgres)}
        for job_id, cost, on_demand in s.execute(statements.costs, params).all():
            self._costs[job_id] = (cost, on_demand)
        for job_id, measured, utilization, peak in s.execute(statements.gpu, params).all():
            self._gpu[job_id] = (float(measured), float(utilization), peak)
        # Columns, not mapped objects: a page reads a few hundred rows, and building an ORM object per row
        # cost more than the rest of the page. Fetched all at once (``all``): a core result iterated
        # fetches its rows one at a time from the driver.
        for allocation in s.execute(statements.allocations, params).all():
            self._allocations[allocation.job_id].append(allocation)
        wanted = sorted({max(rows, key=lambda a: a.attempt).cluster_id
                         for rows in self._allocations.values() if rows})
        for cluster in s.execute(statements.clusters, {**params, "wanted": listed(wanted, postgres)}).all():
            self._clusters[cluster.id] = cluster
            if cluster.job_id in self.ids and cluster.up_at is not None:
                newest = self._up.get(cluster.job_id)
                if newest is None or cluster.created_at > newest.created_at:
                    self._up[cluster.job_id] = cluster
        self._progress = _newest_per_job(s.execute(statements.progress, params).all())
        self._prediction = _newest_per_job(s.execute(statements.prediction, params).all())

    def _read_earlier(self, jobs: Sequence[Job]) -> None:
        """The latest finished jobs of each name and team on the page (``summary._earlier_error``), and the
        prediction errors of those and of the page's finished jobs (``summary._errors``): the ids through
        the (name, team, finished_at) index, then only the jobs whose errors this process has not kept. A
        name whose latest finished jobs are those its kept error was summed from is answered from that."""
        cache: dict[tuple[str, str], list[Job]] = self.memo.setdefault("earlier_jobs", {})
        scored: dict[str, list[tuple[float, float]]] = self.memo.setdefault("prediction_errors", {})
        outside: dict[tuple[str, str], dict[str, Any] | None] = self.memo.setdefault("earlier_errors", {})
        kept = self.kept
        known = kept.jobs()
        page = self.ids
        earlier: dict[tuple[str, str], tuple[str, ...]] = {}
        pairs = sorted({(job.name, job.team) for job in jobs} - set(cache))
        for pair, ids in self._latest_finished(pairs).items():
            summed = kept.outside.get(pair)
            # A job of the page among them has its own error summed from the others': theirs must be kept
            # (a keep started again since may have dropped them).
            among = not page.isdisjoint(ids)
            if summed is not None and summed.ids == ids and (not among or all(i in known for i in ids)):
                outside[pair], cache[pair] = summed.error, summed.rows
                if among:
                    for job_id in ids:
                        scored.setdefault(job_id, known[job_id][1])
            else:
                earlier[pair] = ids
        now_kept: set[str] = set()  # kept by this read
        finished = {job.id: (job.finished_at, job.wall_finished_at) for job in jobs if job.state == "SUCCEEDED"}
        unknown = sorted({job_id for ids in earlier.values() for job_id in ids if job_id not in known}
                         | {job_id for job_id in finished if job_id not in known})
        if unknown:
            for job_id, finished_at, wall_finished_at in self.s.execute(
                    select(JobRow.id, JobRow.finished_at, JobRow.wall_finished_at).where(JobRow.id.in_(unknown))):
                finished[str(job_id)] = (finished_at, wall_finished_at)
            made: dict[str, list[Prediction]] = {job_id: [] for job_id in unknown}
            for job_id, made_at, finish_at in self.s.execute(
                    select(PredictionRow.job_id, PredictionRow.made_at, PredictionRow.finish_at)
                    .where(PredictionRow.job_id.in_(unknown)).order_by(PredictionRow.id)):
                made[str(job_id)].append(cast("Prediction", Made(made_at, finish_at)))
            settled = datetime.now(UTC) - SETTLED
            for job_id in unknown:
                finished_at, wall_finished_at = finished[job_id]
                errors = errors_of(finished_at, made[job_id])
                scored[job_id] = errors
                if finished_at is not None and wall_finished_at is not None and wall_finished_at <= settled:
                    kept.put(job_id, finished_at, errors)
                    now_kept.add(job_id)
        for pair, ids in earlier.items():
            rows = []
            for job_id in ids:
                if job_id in known:
                    finished_at, errors = known[job_id]
                    scored.setdefault(job_id, errors)
                else:
                    finished_at = finished[job_id][0]
                rows.append(cast("Job", Finished(job_id, pair[0], pair[1], "SUCCEEDED", finished_at)))
            cache[pair] = rows
            if all(job_id in known or job_id in now_kept for job_id in ids):
                self.settled[pair] = ids
        for job_id in finished:
            if job_id not in scored:
                scored[job_id] = known[job_id][1]

    def _latest_finished(self, pairs: list[tuple[str, str]]) -> dict[tuple[str, str], tuple[str, ...]]:
        """The ids of the ``EARLIER_JOBS + 1`` latest finished jobs of each name and team, latest first: each
        pair's through the (name, team, finished_at) index."""
        if not pairs:
            return {}
        if self.s.get_bind().dialect.name == "postgresql":
            # One short statement whatever the number of pairs (the driver parses a long one every time).
            return {(name, team): tuple(ids) for name, team, ids in self.s.execute(
                LATEST_FINISHED_PG, {"names": [name for name, _ in pairs], "teams": [team for _, team in pairs]})}
        # A branch per pair, a fixed number of them per bucket of sizes, so that the statement is built and
        # compiled once per bucket, not once per page (the padding repeats the last pair; its rows come
        # twice); at most ``BRANCHES`` per statement (SQLite takes 500 at most).
        found: dict[tuple[str, str], list[str]] = {pair: [] for pair in pairs}
        seen: set[str] = set()
        for start in range(0, len(pairs), BRANCHES):
            chunk = pairs[start:start + BRANCHES]
            padded = chunk + [chunk[-1]] * (bucket(len(chunk)) - len(chunk))
            params = {f"{key}{i}": value for i, pair in enumerate(padded)
                      for key, value in zip(("name", "team"), pair, strict=True)}
            for job_id, name, team in self.s.execute(latest_finished_by_branch(len(padded)), params):
                if job_id not in seen:
                    seen.add(job_id)
                    found[(name, team)].append(job_id)
        return {pair: tuple(ids) for pair, ids in found.items()}

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


def _newest_per_job(rows: Iterable[Any]) -> dict[str, Any]:
    """Each job's row among its rows with the latest time (``_Reads.progress``): the latest id among equal
    times (``order_by(at desc, id desc)``)."""
    found: dict[str, Any] = {}
    for candidate in rows:
        if candidate.job_id not in found or candidate.id > found[candidate.job_id].id:
            found[candidate.job_id] = candidate
    return found


def page_summaries(s: Session, jobs: Iterable[Job], now: datetime | None = None,
                   clock_now: datetime | None = None) -> list[dict[str, Any]]:
    """The summaries of ``jobs`` (``broker.status.orm_source.job_summary`` of each), read in bulk."""
    page = list(jobs)
    source = PageSource(s, page)
    found = [summarise(source, job, now, clock_now) for job in page]
    summed = source.memo.get("earlier_errors", {})
    rows = source.memo.get("earlier_jobs", {})
    for pair, ids in source.settled.items():
        if pair in summed:
            source.kept.outside[pair] = Outside(ids, summed[pair], rows[pair])
    return found
