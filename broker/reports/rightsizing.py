"""The report's right-sizing section: for each finished job of the window its agents measured, what fits.

The figures come from the GPU roll-up (peak memory, mean utilisation over the job's measured GPU
time, pooled with its earlier runs for a recurring job: ``broker/reports/recurring.py``), the job's
ledger in the window (GPU-hours held and their cost) and the prices the fleet actually paid per GPU
type in the window (its ledger: cost over GPU-hours). GPU memory per type is the catalog's; speeds
are the job's own where its step times were measured on several types, else the documented default
table (``policies/speed.py``). The advice itself is the pure ``policies.rightsizing.suggest``;
nothing is applied.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from sqlalchemy import func, select

from broker.model import JobState
from broker.reports.recurring import Pooled, measured_speeds, pooled
from broker.reports.sums import Cell, JobCell
from broker.store.rollup import LedgerRollupRow
from broker.store.tables import JobRow, LedgerRow
from policies.rightsizing import GpuOffer, RightSizingRequest, Suggestion, suggest
from policies.speed import DEFAULT_SPEED
from providers.catalog import instance_types

FINISHED = tuple(state.value for state in JobState if state.terminal)
OFFERS_SPAN = timedelta(days=7)  # the job page prices other GPU types at what the fleet paid in this span


@dataclass
class RightSize:
    job_id: str
    label: str
    suggestions: list[dict[str, Any]] = field(default_factory=list)
    runs: int = 1  # the runs of the recurring job (same name and team) its figures pool


def gpu_memory_gb(accelerator: str) -> float | None:
    found = instance_types(accelerator=accelerator)
    return found[0].gpu_memory_gb if found and found[0].gpu_memory_gb > 0 else None


def paid_offers(cells: list[Cell]) -> tuple[GpuOffer, ...]:
    """Each GPU type the fleet ran in the window, at what it paid per GPU-hour there."""
    spent: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0])
    for cell in cells:
        spent[cell.gpu][0] += cell.cost
        spent[cell.gpu][1] += cell.gpu_minutes / 60.0
    return _offers({gpu: (cost, hours) for gpu, (cost, hours) in spent.items()})


def _offers(spent: dict[str, tuple[float, float]]) -> tuple[GpuOffer, ...]:
    """GPU type -> (cost, GPU-hours) as offers at the price paid per GPU-hour, for types of known memory."""
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
    jobs = list(session.scalars(select(JobRow).where(JobRow.id.in_(sorted(held)), JobRow.state.in_(FINISHED))))
    figures = pooled(session, jobs)
    speeds = measured_speeds(session, [j for j in jobs if j.id in figures])
    offers = paid_offers(cells)
    found: list[tuple[float, RightSize]] = []
    for job in jobs:
        if job.id not in figures:
            continue
        gpu_hours, cost = held[job.id]
        request = sizing_request(job, figures[job.id], gpu_hours, cost, offers, speeds.get((job.name, job.team), {}))
        advice: tuple[Suggestion, ...] = suggest(request) if request is not None else ()
        if advice:
            entry = RightSize(job.id, f"{job.name} ({job.team})",
                              [{"kind": a.kind, "text": a.text, "saving": round(a.saving, 6),
                                "slower": round(a.slower, 4)} for a in advice], figures[job.id].runs)
            found.append((advice[0].saving, entry))
    return [entry for _, entry in sorted(found, key=lambda x: (-x[0], x[1].job_id))][:limit]


def sizing_request(job: JobRow, figures: Pooled, gpu_hours: float, cost: float, offers: tuple[GpuOffer, ...],
                   speeds: dict[str, float]) -> RightSizingRequest | None:
    """What ``suggest`` needs for one job, from its (pooled) GPU roll-up sums and its ledger; None when unmeasured."""
    seconds, util_s, peak_mb, total_mb = (figures.seconds, figures.utilization_seconds, figures.peak_memory_mb,
                                          figures.memory_total_mb)
    if not seconds or peak_mb is None or not job.accelerator:
        return None
    memory = total_mb / 1024.0 if total_mb else gpu_memory_gb(job.accelerator)
    return RightSizingRequest(
        job_id=job.id, accelerator=job.accelerator, gpus=max(job.num_nodes * job.gpus_per_node, 1),
        gpu_memory_gb=memory or 0.0, peak_memory_gb=peak_mb / 1024.0,
        mean_utilization=min(max(util_s / seconds / 100.0, 0.0), 1.0), gpu_hours=gpu_hours, cost=cost,
        gpu_share=job.gpu_share, offers=offers, speeds=DEFAULT_SPEED, measured_speeds=speeds, runs=figures.runs)


def job_suggestions(session: Any, job: JobRow) -> tuple[Suggestion, ...]:
    """The job page's advice for one finished job: its whole ledger, at the prices the fleet paid while it ran."""
    if job.state not in FINISHED:
        return ()
    end = job.finished_at or job.updated_at
    figures = pooled(session, [job]).get(job.id)
    if figures is None:
        return ()
    gpu_hours, cost = session.execute(select(func.coalesce(func.sum(LedgerRow.gpus * LedgerRow.seconds), 0.0),
                                             func.coalesce(func.sum(LedgerRow.cost), 0.0))
                                      .where(LedgerRow.job_id == job.id)).one()
    # What the fleet paid per GPU type in the week before the job's end, from the ledger's hourly roll-up.
    start = end - OFFERS_SPAN
    U = LedgerRollupRow
    paid = session.execute(select(U.accelerator, func.sum(U.cost), func.sum(U.gpu_minutes))
                           .where(U.hour >= start.replace(minute=0, second=0, microsecond=0), U.hour < end)
                           .group_by(U.accelerator))
    offers = _offers({gpu: (float(c or 0.0), float(g or 0.0) / 60.0) for gpu, c, g in paid if gpu})
    speeds = measured_speeds(session, [job]).get((job.name, job.team), {})
    request = sizing_request(job, figures, float(gpu_hours) / 3600.0, float(cost), offers, speeds)
    return suggest(request) if request is not None else ()
