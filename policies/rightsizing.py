"""Right-sizing: what a finished job's measured GPUs say it would have needed, and what that would have saved.

From its GPUs' measured peak memory and mean utilisation (``RightSizingRequest``), three kinds of
advice, each with the saving at the prices the job actually paid, never applied by the broker:

- ``fraction``: a one-GPU job whose peak memory and utilisation, with headroom, fit a quarter or
  a half of its GPU: ask for ``GPU:0.25`` / ``GPU:0.5`` (it pays that share);
- ``fewer_gpus``: a multi-GPU job whose GPUs, busy ``u`` of the time, would be ``TARGET_BUSY``
  busy on ``ceil(n * u / TARGET_BUSY)`` of them (where its work divides across fewer);
- ``cheaper_gpu``: the GPU type with enough memory (peak times ``MEMORY_HEADROOM``) that would have
  cost least: the busy share of its time stretched by the speed ratio, the idle share not. The
  ratio is the job's own where its step times were measured on both types (``measured_speeds``,
  from ``speeds_from_step_times``), else the documented default table (``speeds``), and says which.

For a recurring job (same name and team) the figures may pool its earlier runs (``runs``): the
highest peak memory of any of them and the utilisation over all their measured GPU time.

Pure: no I/O; the report gathers the figures (``broker/reports/rightsizing.py``).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

MEMORY_HEADROOM = 1.2  # the peak must fit with 20 % to spare
TARGET_BUSY = 0.8  # utilisation a right-sized job's GPUs should reach
FRACTIONS = (0.25, 0.5)


@dataclass(frozen=True, slots=True)
class GpuOffer:
    accelerator: str
    memory_gb: float  # per GPU
    price_per_gpu_hour: float


@dataclass(frozen=True, slots=True)
class RightSizingRequest:
    job_id: str
    accelerator: str
    gpus: int  # GPUs it held (whole GPUs; a fraction's job is already sized)
    gpu_memory_gb: float  # per GPU
    peak_memory_gb: float  # the highest any of its GPUs reached
    mean_utilization: float  # 0-1, over its measured GPU time
    gpu_hours: float  # GPU-hours it held (its ledger)
    cost: float  # what those cost
    gpu_share: float | None = None
    offers: tuple[GpuOffer, ...] = ()
    speeds: Mapping[str, float] = field(default_factory=dict)  # relative training speed per GPU type (a table)
    measured_speeds: Mapping[str, float] = field(default_factory=dict)  # the job's own, from its step times
    runs: int = 1  # the runs of the (recurring) job its figures pool


@dataclass(frozen=True, slots=True)
class Suggestion:
    kind: str  # fraction | fewer_gpus | cheaper_gpu
    text: str
    saving: float
    slower: float = 1.0  # the run's time on the suggestion over its time as it ran


def suggest(request: RightSizingRequest) -> tuple[Suggestion, ...]:
    r = request
    if r.gpus <= 0 or r.gpu_hours <= 0 or r.cost <= 0 or not 0 <= r.mean_utilization <= 1:
        return ()
    found = [s for s in (_fraction(r), _fewer(r), _cheaper(r)) if s is not None and s.saving > 0.005]
    return tuple(sorted(found, key=lambda s: -s.saving))


def _over(r: RightSizingRequest) -> str:
    return f" over its last {r.runs} runs" if r.runs > 1 else ""


def _fraction(r: RightSizingRequest) -> Suggestion | None:
    if r.gpus != 1 or r.gpu_share is not None or r.gpu_memory_gb <= 0:
        return None
    need = max(r.peak_memory_gb * MEMORY_HEADROOM / r.gpu_memory_gb, r.mean_utilization / TARGET_BUSY)
    share = next((f for f in FRACTIONS if f >= need), None)
    if share is None:
        return None
    saving = r.cost * (1 - share)
    return Suggestion("fraction", f"it would have fit {share:g} of its {r.accelerator} (peak {r.peak_memory_gb:.1f} "
                                  f"of {r.gpu_memory_gb:.0f} GB, {100 * r.mean_utilization:.0f}% busy{_over(r)}): "
                                  f"ask for {r.accelerator}:{share:g} and save ${saving:,.2f}", saving)


def _fewer(r: RightSizingRequest) -> Suggestion | None:
    if r.gpus < 2:
        return None
    fewer = max(1, math.ceil(r.gpus * r.mean_utilization / TARGET_BUSY - 1e-9))
    if fewer >= r.gpus:
        return None
    saving = r.cost * (1 - fewer / r.gpus)
    return Suggestion("fewer_gpus", f"its {r.gpus} GPUs were {100 * r.mean_utilization:.0f}% busy{_over(r)}: "
                                    f"{fewer} would have been {100 * min(r.gpus * r.mean_utilization / fewer, 1.0):.0f}"
                                    f"% busy, saving ${saving:,.2f} where its work divides across fewer GPUs", saving)


def speeds_from_step_times(step_seconds: Mapping[str, Sequence[float]]) -> dict[str, float]:
    """Relative speed per GPU type from a job's measured seconds per step there (1 / their median).

    Empty unless at least two types were measured: one type alone compares with nothing.
    """
    medians = {gpu: statistics.median(s) for gpu, s in step_seconds.items()
               if s and all(math.isfinite(x) and x > 0 for x in s)}
    return {gpu: 1.0 / m for gpu, m in medians.items()} if len(medians) >= 2 else {}


def _ratio(r: RightSizingRequest, other: str) -> tuple[float, bool]:
    """How many times as long the busy time takes on ``other`` as on the job's own type; True if measured."""
    mine, theirs = r.measured_speeds.get(r.accelerator), r.measured_speeds.get(other)
    if mine and theirs:
        return mine / theirs, True
    mine, theirs = r.speeds.get(r.accelerator), r.speeds.get(other)
    return (mine / theirs if mine and theirs else 1.0), False


def _cheaper(r: RightSizingRequest) -> Suggestion | None:
    best: tuple[float, float, GpuOffer, bool] | None = None
    for offer in r.offers:
        if offer.accelerator == r.accelerator or offer.memory_gb < r.peak_memory_gb * MEMORY_HEADROOM:
            continue
        ratio, measured = _ratio(r, offer.accelerator)
        slower = r.mean_utilization * ratio + (1 - r.mean_utilization)
        cost = r.gpu_hours * slower * offer.price_per_gpu_hour
        if best is None or cost < best[0]:
            best = (cost, slower, offer, measured)
    if best is None:
        return None
    cost, slower, offer, measured = best
    source = "measured from its step times on both" if measured else "from the default speed table, not measured"
    pace = f"about {slower:.2f}x as long" if abs(slower - 1) > 0.005 else "as fast"
    return Suggestion("cheaper_gpu", f"{r.gpus}x {offer.accelerator} ({offer.memory_gb:.0f} GB, at least "
                                     f"{MEMORY_HEADROOM:g}x its {r.peak_memory_gb:.1f} GB peak) at "
                                     f"${offer.price_per_gpu_hour:,.2f}/GPU-h would have cost ${cost:,.2f} instead of "
                                     f"${r.cost:,.2f}, running {pace} (speeds {source})", r.cost - cost, slower)
