"""What a job cost and went through, read from the store: shared by ``launch``, ``status`` and the API."""

from __future__ import annotations

from datetime import datetime
from pathlib import Path
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from broker.store.tables import AllocationRow, ClusterRow, JobRow, LedgerRow, PredictionRow, ProgressRow

EARLIER_JOBS = 20  # finished jobs of the same name and team whose predictions are scored


def job_summary(s: Session, job: JobRow) -> dict[str, Any]:
    """The fields ``status --json`` and ``launch --json`` print (documented in the README)."""
    cost, on_demand = s.execute(
        select(func.coalesce(func.sum(LedgerRow.cost), 0.0), func.coalesce(func.sum(LedgerRow.on_demand_cost), 0.0))
        .where(LedgerRow.job_id == job.id)
    ).one()
    ran_on = s.scalar(select(AllocationRow.cluster_id).where(AllocationRow.job_id == job.id)
                      .order_by(AllocationRow.attempt.desc()).limit(1))
    cluster = s.get(ClusterRow, ran_on) if ran_on else None  # a pool's cluster may have been launched for another job
    if cluster is None:
        cluster = s.scalar(select(ClusterRow).where(ClusterRow.job_id == job.id, ClusterRow.up_at.is_not(None))
                           .order_by(ClusterRow.created_at.desc()))
    wall_end = job.wall_finished_at or (None if job.finished_at else _utcnow())
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
        **progress_fields(s, job),
    }


def progress_fields(s: Session, job: JobRow) -> dict[str, Any]:
    """Progress, the latest predicted finish (market clock) and how far off earlier predictions were."""
    report = s.scalar(select(ProgressRow).where(ProgressRow.job_id == job.id)
                      .order_by(ProgressRow.at.desc(), ProgressRow.id.desc()).limit(1))
    latest = s.scalar(select(AllocationRow).where(AllocationRow.job_id == job.id)
                      .order_by(AllocationRow.attempt.desc()).limit(1))
    predicted = s.scalar(select(PredictionRow).where(PredictionRow.job_id == job.id)
                         .order_by(PredictionRow.made_at.desc(), PredictionRow.id.desc()).limit(1))
    own = _errors(s, job) if job.state == "SUCCEEDED" else []
    return {
        "progress": {"step": report.step, "total": report.total} if report else None,
        "started_at": _iso((latest.running_at or latest.started_at) if latest else None),
        "predicted_finish": _iso(predicted.finish_at if predicted else None),
        "predicted_finish_low": _iso(predicted.low_at if predicted else None),
        "predicted_finish_high": _iso(predicted.high_at if predicted else None),
        "prediction_source": predicted.source if predicted else None,
        "prediction_error_s": round(_median([abs(e) for e, _ in own]), 1) if own else None,
        "earlier_prediction_error": _earlier_error(s, job),
    }


def _earlier_error(s: Session, job: JobRow) -> dict[str, Any] | None:
    """``prediction_error`` of the latest finished jobs of the job's name and team, the job itself left out.

    Read once per name and team in a session (``status`` of many jobs of one name asks for the same).
    """
    cache: dict[tuple[str, str], list[JobRow]] = s.info.setdefault("earlier_jobs", {})
    key = (job.name, job.team)
    if key not in cache:
        cache[key] = list(s.scalars(select(JobRow).where(JobRow.name == job.name, JobRow.team == job.team,
                                                         JobRow.state == "SUCCEEDED")
                                    .order_by(JobRow.finished_at.desc()).limit(EARLIER_JOBS + 1)))
    earlier = [other for other in cache[key] if other.id != job.id][:EARLIER_JOBS]
    scored: dict[str, list[tuple[float, float]]] = s.info.setdefault("prediction_errors", {})
    for other in earlier:
        if other.id not in scored:
            scored[other.id] = _errors(s, other)
    return _summarise([scored[other.id] for other in earlier])


def _errors(s: Session, job: JobRow) -> list[tuple[float, float]]:
    """(seconds off, fraction of the time then left) of every prediction kept for a finished job."""
    if job.finished_at is None:
        return []
    found = []
    for row in s.scalars(select(PredictionRow).where(PredictionRow.job_id == job.id)):
        off = (row.finish_at - job.finished_at).total_seconds()
        left = max((job.finished_at - row.made_at).total_seconds(), 1.0)
        found.append((off, abs(off) / left))
    return found


def prediction_error(s: Session, jobs: list[JobRow]) -> dict[str, Any] | None:
    """How far off the predictions of these finished jobs were: medians over jobs of each job's median."""
    return _summarise([_errors(s, job) for job in jobs])


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
    logs = sorted((home / "logs" / job_id).glob("attempt-*-node-0.log"),
                  key=lambda p: int(p.name.split("-")[1]))
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
