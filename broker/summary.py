"""What a job cost and went through, read from the store: shared by ``launch``, ``status`` and the API."""

from __future__ import annotations

from datetime import datetime
from pathlib import Path
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from broker.store.tables import ClusterRow, JobRow, LedgerRow


def job_summary(s: Session, job: JobRow) -> dict[str, Any]:
    """The fields ``status --json`` and ``launch --json`` print (documented in the README)."""
    cost, on_demand = s.execute(
        select(func.coalesce(func.sum(LedgerRow.cost), 0.0), func.coalesce(func.sum(LedgerRow.on_demand_cost), 0.0))
        .where(LedgerRow.job_id == job.id)
    ).one()
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
    }


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
