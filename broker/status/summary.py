"""What a job cost and went through, read from the store: shared by ``launch``, ``status`` and the API.

The fields are computed here once, from whatever a ``SummarySource`` reads: the SQLAlchemy session
(``broker.status.orm_source``, every store) or the standard library's ``sqlite3`` on an embedded store
already at the newest migration (``broker.status.readonly``, what ``broker status`` uses so that it
imports no SQLAlchemy). Only the reading differs; the summary, and so what is printed, cannot.
"""

from __future__ import annotations

from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from broker.status.joblogs import log_files
from broker.status.progress import job_progress

if TYPE_CHECKING:
    from broker.status.progress import Span

EARLIER_JOBS = 20  # finished jobs of the same name and team whose predictions are scored


class Job(Protocol):
    """The columns of a ``jobs`` row a summary reads."""

    @property
    def id(self) -> str: ...
    @property
    def name(self) -> str: ...
    @property
    def team(self) -> str: ...
    @property
    def state(self) -> str: ...
    @property
    def pipeline_id(self) -> str | None: ...
    @property
    def stage(self) -> int | None: ...
    @property
    def preemptions(self) -> int: ...
    @property
    def migrations(self) -> int: ...
    @property
    def zones(self) -> list[str]: ...
    @property
    def work_lost_s(self) -> float: ...
    @property
    def work_s(self) -> float | None: ...
    @property
    def num_nodes(self) -> int: ...
    @property
    def attempt(self) -> int: ...
    @property
    def checkpoint(self) -> str | None: ...
    @property
    def deadline(self) -> datetime | None: ...
    @property
    def created_at(self) -> datetime: ...
    @property
    def finished_at(self) -> datetime | None: ...
    @property
    def wall_started_at(self) -> datetime | None: ...
    @property
    def wall_finished_at(self) -> datetime | None: ...
    @property
    def exit_code(self) -> int | None: ...
    @property
    def reason(self) -> str | None: ...
    @property
    def checkpoint_reason(self) -> str | None: ...


class Cluster(Protocol):
    @property
    def cloud(self) -> str: ...
    @property
    def zone(self) -> str: ...
    @property
    def instance_type(self) -> str: ...
    @property
    def spot(self) -> bool: ...
    @property
    def price_per_node_hour(self) -> float: ...
    @property
    def num_nodes(self) -> int: ...
    @property
    def teardown_reason(self) -> str | None: ...


class Allocation(Protocol):
    @property
    def cluster_id(self) -> str: ...
    @property
    def started_at(self) -> datetime: ...
    @property
    def running_at(self) -> datetime | None: ...


class Progress(Protocol):
    @property
    def step(self) -> int: ...
    @property
    def total(self) -> int | None: ...


class Prediction(Protocol):
    @property
    def made_at(self) -> datetime: ...
    @property
    def finish_at(self) -> datetime: ...
    @property
    def low_at(self) -> datetime: ...
    @property
    def high_at(self) -> datetime: ...
    @property
    def source(self) -> str: ...


class SummarySource(Protocol):
    """The reads a summary needs, each the same query on either reader."""

    memo: dict[str, Any]  # what stays the same for every job listed in one read (earlier jobs' errors)

    # every job (of ``state``), oldest first; with ``newest``, only the newest that many
    def jobs(self, state: str | None = None, newest: int | None = None) -> list[Job]: ...
    def job(self, job_id: str) -> Job | None: ...
    def costs(self, job_id: str) -> tuple[float, float]: ...  # (cost, on-demand cost) of the ledger
    # (GPU-seconds measured, their utilisation-seconds in percent, peak memory MB) from the GPU roll-up
    def gpu(self, job_id: str) -> tuple[float, float, float | None]: ...
    def last_allocation(self, job_id: str) -> Allocation | None: ...  # of the latest attempt
    def cluster(self, cluster_id: str) -> Cluster | None: ...
    def newest_cluster_up(self, job_id: str) -> Cluster | None: ...  # launched for the job, came up
    def last_progress(self, job_id: str) -> Progress | None: ...
    def spans(self, job_id: str) -> list[Span]: ...  # every allocation's (started, running, ended)
    def last_prediction(self, job_id: str) -> Prediction | None: ...
    def predictions(self, job_id: str) -> list[Prediction]: ...
    def succeeded(self, name: str, team: str, limit: int) -> list[Job]: ...  # latest finished first


def summaries(source: SummarySource, job_id: str | None, now: datetime | None = None,
              clock_now: datetime | None = None, state: str | None = None,
              newest: int | None = None) -> list[dict[str, Any]] | None:
    """What ``status`` lists: the one job asked for (None when there is none), or every job (of ``state``;
    only the ``newest`` that many), oldest first."""
    if job_id is None:
        return [summarise(source, job, now, clock_now) for job in source.jobs(state, newest)]
    job = source.job(job_id)
    return None if job is None else [summarise(source, job, now, clock_now)]


def summarise(source: SummarySource, job: Job, now: datetime | None = None,
              clock_now: datetime | None = None) -> dict[str, Any]:
    """The fields ``status --json`` and ``launch --json`` print (documented in the README).

    ``now`` (default: the wall clock) ends the wall time of a job still going; ``clock_now`` (default
    ``now``) is the broker's clock, the market's on a replay, against which a progress estimate runs.
    """
    cost, on_demand = source.costs(job.id)
    latest = source.last_allocation(job.id)
    # A pool's cluster may have been launched for another job.
    cluster = source.cluster(latest.cluster_id) if latest else None
    if cluster is None:
        cluster = source.newest_cluster_up(job.id)
    wall_end = job.wall_finished_at or (None if job.finished_at else now or _utcnow())
    wall = (wall_end - job.wall_started_at).total_seconds() if job.wall_started_at and wall_end else 0.0
    return {
        "job_id": job.id,
        "name": job.name,
        "pipeline_id": job.pipeline_id,  # a stage of a multi-document job file, else None
        "stage": job.stage,
        "team": job.team,
        "state": job.state,
        "cost": round(float(cost), 6),
        "on_demand_cost": round(float(on_demand), 6),
        "saving_pct": round(100.0 * (1 - float(cost) / float(on_demand)), 1) if on_demand else None,
        "preemptions": job.preemptions,
        "migrations": job.migrations,
        "zones": list(job.zones or []),
        "wall_seconds": round(wall, 1),
        "work_lost_seconds": round(job.work_lost_s, 1),
        "cloud": cluster.cloud if cluster else None,
        "zone": cluster.zone if cluster else None,
        "instance_type": cluster.instance_type if cluster else None,
        "spot": cluster.spot if cluster else None,
        "price_per_hour": round(cluster.price_per_node_hour * cluster.num_nodes, 4) if cluster else None,
        "num_nodes": job.num_nodes,
        "attempt": job.attempt,
        "checkpoint": job.checkpoint,
        "deadline": _iso(job.deadline),
        "submitted_at": _iso(job.created_at),
        "finished_at": _iso(job.finished_at),
        "exit_code": job.exit_code,
        "reason": job.reason,
        "checkpoint_reason": job.checkpoint_reason,
        "cluster_teardown_reason": cluster.teardown_reason if cluster else None,
        "gpu": gpu_fields(*source.gpu(job.id)),
        **_progress_fields(source, job, latest, clock_now or now or _utcnow()),
    }


def gpu_fields(measured_s: float, utilization_s: float, peak_memory_mb: float | None) -> dict[str, Any] | None:
    """What the job's GPUs did, as its agents measured (None: never measured, e.g. a node without NVML)."""
    if not measured_s and peak_memory_mb is None:
        return None
    return {"mean_utilization": round(utilization_s / measured_s / 100.0, 4) if measured_s else None,
            "peak_memory_gb": round(peak_memory_mb / 1024.0, 3) if peak_memory_mb is not None else None,
            "measured_gpu_hours": round(measured_s / 3600.0, 4)}


def _progress_fields(source: SummarySource, job: Job, latest: Allocation | None,
                     clock_now: datetime) -> dict[str, Any]:
    """Progress, the latest predicted finish (market clock) and how far off earlier predictions were."""
    report = source.last_progress(job.id)
    predicted = source.last_prediction(job.id)
    own = _scored(source, job) if job.state == "SUCCEEDED" else []
    figure = job_progress(job.state, (report.step, report.total) if report else None,
                          job.work_s, job.work_lost_s,
                          [] if report else source.spans(job.id), clock_now)
    return {
        "progress": {"step": report.step, "total": report.total} if report else None,
        # The one figure every view shows (``broker.status.progress``): the job's report first, else the estimate.
        "progress_share": None if figure.share is None else round(figure.share, 4),
        "progress_source": figure.source,
        "progress_text": figure.text(),
        "started_at": _iso((latest.running_at or latest.started_at) if latest else None),
        "predicted_finish": _iso(predicted.finish_at if predicted else None),
        "predicted_finish_low": _iso(predicted.low_at if predicted else None),
        "predicted_finish_high": _iso(predicted.high_at if predicted else None),
        "prediction_source": predicted.source if predicted else None,
        "prediction_error_s": round(_median([abs(e) for e, _ in own]), 1) if own else None,
        "earlier_prediction_error": _earlier_error(source, job),
    }


def _earlier_error(source: SummarySource, job: Job) -> dict[str, Any] | None:
    """``prediction_error`` of the latest finished jobs of the job's name and team, the job itself left out.

    Read once per name and team in one read (``status`` of many jobs of one name asks for the same).
    """
    cache: dict[tuple[str, str], list[Job]] = source.memo.setdefault("earlier_jobs", {})
    key = (job.name, job.team)
    if key not in cache:
        cache[key] = source.succeeded(job.name, job.team, EARLIER_JOBS + 1)
    # The same for every job of the name and team that is not one of those earlier jobs: summed once.
    outside: dict[tuple[str, str], dict[str, Any] | None] = source.memo.setdefault("earlier_errors", {})
    members: dict[tuple[str, str], set[str]] = source.memo.setdefault("earlier_ids", {})
    if key not in members:
        members[key] = {other.id for other in cache[key]}
    among = job.id in members[key]
    if not among and key in outside:
        return outside[key]
    earlier = [other for other in cache[key] if other.id != job.id][:EARLIER_JOBS]
    scored: dict[str, list[tuple[float, float]]] = source.memo.setdefault("prediction_errors", {})
    for other in earlier:
        if other.id not in scored:
            scored[other.id] = _errors(source, other)
    found = _summarise([scored[other.id] for other in earlier])
    if not among:
        outside[key] = found
    return found


def _scored(source: SummarySource, job: Job) -> list[tuple[float, float]]:
    """``_errors`` of the job, read once per read (a bulk read may have them already)."""
    scored: dict[str, list[tuple[float, float]]] = source.memo.setdefault("prediction_errors", {})
    if job.id not in scored:
        scored[job.id] = _errors(source, job)
    return scored[job.id]


def _errors(source: SummarySource, job: Job) -> list[tuple[float, float]]:
    """(seconds off, fraction of the time then left) of every prediction kept for a finished job."""
    if job.finished_at is None:
        return []
    return errors_of(job.finished_at, source.predictions(job.id))


def errors_of(finished_at: datetime | None, predictions: list[Prediction]) -> list[tuple[float, float]]:
    """``_errors`` of a job that finished at ``finished_at`` from its predictions (in the order stored)."""
    if finished_at is None:
        return []
    found = []
    for row in predictions:
        off = (row.finish_at - finished_at).total_seconds()
        left = max((finished_at - row.made_at).total_seconds(), 1.0)
        found.append((off, abs(off) / left))
    return found


def _summarise(errors_per_job: list[list[tuple[float, float]]]) -> dict[str, Any] | None:
    per_job = [errors for errors in errors_per_job if errors]
    if not per_job:
        return None
    seconds = _median([_median([abs(e) for e, _ in errors]) for errors in per_job])
    fraction = _median([_median([f for _, f in errors]) for errors in per_job])
    return {"jobs": len(per_job), "median_error_s": round(seconds, 1), "median_error_pct": round(100 * fraction, 1)}


def _median(values: list[float]) -> float:
    ordered = sorted(values)
    middle = len(ordered) // 2
    return ordered[middle] if len(ordered) % 2 else (ordered[middle - 1] + ordered[middle]) / 2


def last_log_line(home: Path, job_id: str) -> str:
    """The last line the job printed on node 0 of its latest attempt (the agent's own lines left out)."""
    logs = [path for path in log_files(home, job_id) if path.name.endswith("-node-0.log")]
    if not logs:
        return ""
    try:
        with logs[-1].open("rb") as handle:
            handle.seek(0, 2)
            handle.seek(max(handle.tell() - 2048, 0))
            lines = [ln for ln in handle.read().decode(errors="replace").splitlines() if ln.strip()]
    except OSError:
        return ""
    job_lines = [ln for ln in lines if not ln.startswith("[agent]")]
    return job_lines[-1].strip() if job_lines else ""


def _iso(value: datetime | None) -> str | None:
    return value.isoformat() if value else None


def _utcnow() -> datetime:
    from datetime import UTC

    return datetime.now(UTC)
