"""The report's right-sizing section: for each finished job of the window its agents measured, what fits.

The figures come from the GPU roll-up (peak memory, mean utilisation over the job's measured GPU
time), the job's ledger in the window (GPU-hours held and their cost) and the prices the fleet
actually paid per GPU type in the window (its ledger: cost over GPU-hours). GPU memory per type
is the catalog's; speeds are the documented default table (``policies/speed.py``). The advice
itself is the pure ``policies.rightsizing.suggest``; nothing is applied.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import func, select

from broker.model import JobState
from broker.reports.sums import Cell, JobCell
from broker.store.gpu import GpuRollupRow
from broker.store.tables import JobRow, LedgerRow
from policies.rightsizing import GpuOffer, RightSizingRequest, Suggestion, suggest
from policies.speed import DEFAULT_SPEED
from providers.catalog import instance_types

FINISHED = tuple(state.value for state in JobState if state.terminal)


@dataclass
class RightSize:
    job_id: str
    label: str
    suggestions: list[dict[str, Any]] = field(default_factory=list)


def gpu_memory_gb(accelerator: str) -> float | None:
    found = instance_types(accelerator=accelerator)
    return found[0].gpu_memory_gb if found and found[0].gpu_memory_gb > 0 else None


def paid_offers(cells: list[Cell]) -> tuple[GpuOffer, ...]:
    """Each GPU type the fleet ran in the window, at what it paid per GPU-hour there."""
    spent: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0])
    for cell in cells:
        spent[cell.gpu][0] += cell.cost
        spent[cell.gpu][1] += cell.gpu_minutes / 60.0
    offers = []
    for gpu, (cost, hours) in sorted(spent.items()):
        memory = gpu_memory_gb(gpu)
        if memory is not None and hours > 0 and cost > 0:
            offers.append(GpuOffer(gpu, memory, cost / hours))
    return tuple(offers)


def right_sizing(session: Any, per_job: list[JobCell], cells: list[Cell], limit: int = 20) -> list[RightSize]:
    """The finished, measured jobs of the window with advice, largest saving first."""
    held: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0])
    for cell in per_job:
        if cell.job_id:
            held[cell.job_id][0] += cell.gpu_minutes / 60.0
            held[cell.job_id][1] += cell.cost
    if not held:
        return []
    R = GpuRollupRow
    measured = {row[0]: row[1:] for row in session.execute(
        select(R.job_id, func.sum(R.measured_seconds), func.sum(R.utilization_seconds), func.max(R.peak_memory_mb),
               func.max(R.memory_total_mb)).where(R.job_id.in_(sorted(held))).group_by(R.job_id))}
    jobs = {j.id: j for j in session.scalars(select(JobRow).where(JobRow.id.in_(sorted(measured)),
                                                                 JobRow.state.in_(FINISHED)))}
    offers = paid_offers(cells)
    found: list[tuple[float, RightSize]] = []
    for job_id, job in jobs.items():
        gpu_hours, cost = held[job_id]
        seconds, util_s, peak_mb, total_mb = measured[job_id]
        request = sizing_request(job, seconds, util_s, peak_mb, total_mb, gpu_hours, cost, offers)
        advice: tuple[Suggestion, ...] = suggest(request) if request is not None else ()
        if advice:
            entry = RightSize(job_id, f"{job.name} ({job.team})",
                              [{"kind": a.kind, "text": a.text, "saving": round(a.saving, 6),
                                "slower": round(a.slower, 4)} for a in advice])
            found.append((advice[0].saving, entry))
    return [entry for _, entry in sorted(found, key=lambda x: (-x[0], x[1].job_id))][:limit]


def sizing_request(job: JobRow, seconds: float | None, util_s: float | None, peak_mb: float | None,
                   total_mb: float | None, gpu_hours: float, cost: float,
                   offers: tuple[GpuOffer, ...]) -> RightSizingRequest | None:
    """What ``suggest`` needs for one job, from its GPU roll-up sums and its ledger; None when unmeasured."""
    if not seconds or util_s is None or peak_mb is None or not job.accelerator:
        return None
    memory = total_mb / 1024.0 if total_mb else gpu_memory_gb(job.accelerator)
    return RightSizingRequest(
        job_id=job.id, accelerator=job.accelerator, gpus=max(job.num_nodes * job.gpus_per_node, 1),
        gpu_memory_gb=memory or 0.0, peak_memory_gb=peak_mb / 1024.0,
        mean_utilization=min(max(util_s / seconds / 100.0, 0.0), 1.0), gpu_hours=gpu_hours, cost=cost,
        gpu_share=job.gpu_share, offers=offers, speeds=DEFAULT_SPEED)


def job_suggestions(session: Any, job: JobRow) -> tuple[Suggestion, ...]:
    """The job page's advice for one finished job: its whole ledger, without other GPU types' prices."""
    if job.state not in FINISHED:
        return ()
    R = GpuRollupRow
    seconds, util_s, peak_mb, total_mb = session.execute(
        select(func.sum(R.measured_seconds), func.sum(R.utilization_seconds), func.max(R.peak_memory_mb),
               func.max(R.memory_total_mb)).where(R.job_id == job.id)).one()
    gpu_hours, cost = session.execute(select(func.coalesce(func.sum(LedgerRow.gpus * LedgerRow.seconds), 0.0),
                                             func.coalesce(func.sum(LedgerRow.cost), 0.0))
                                      .where(LedgerRow.job_id == job.id)).one()
    request = sizing_request(job, seconds, util_s, peak_mb, total_mb, float(gpu_hours) / 3600.0, float(cost), ())
    return suggest(request) if request is not None else ()
