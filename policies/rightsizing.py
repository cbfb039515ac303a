"""Right-sizing: what a finished job's measured GPUs say it would have needed, and what that would have saved.

From its GPUs' measured peak memory and mean utilisation (``RightSizingRequest``), three kinds of
advice, each with the saving at the prices the job actually paid, never applied by the broker:

- ``fraction``: a one-GPU job whose peak memory and utilisation, with headroom, fit a quarter or
  a half of its GPU: ask for ``GPU:0.25`` / ``GPU:0.5`` (it pays that share);
- ``fewer_gpus``: a multi-GPU job whose GPUs, busy ``u`` of the time, would be ``TARGET_BUSY``
  busy on ``ceil(n * u / TARGET_BUSY)`` of them (where its work divides across fewer);
- ``cheaper_gpu``: the GPU type with enough memory (peak times ``MEMORY_HEADROOM``) that would have
  cost least: the busy share of its time stretched by the speed ratio (``speeds``: measured where
  known, else the documented default table), the idle share not.

Pure: no I/O; the report gathers the figures (``broker/reports/rightsizing.py``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
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
    speeds: Mapping[str, float] = field(default_factory=dict)  # relative training speed per GPU type
    speeds_measured: bool = False


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


def _fraction(r: RightSizingRequest) -> Suggestion | None:
    if r.gpus != 1 or r.gpu_share is not None or r.gpu_memory_gb <= 0:
        return None
    need = max(r.peak_memory_gb * MEMORY_HEADROOM / r.gpu_memory_gb, r.mean_utilization / TARGET_BUSY)
    share = next((f for f in FRACTIONS if f >= need), None)
    if share is None:
        return None
    saving = r.cost * (1 - share)
    return Suggestion("fraction", f"it would have fit {share:g} of its {r.accelerator} (peak {r.peak_memory_gb:.1f} "
                                  f"of {r.gpu_memory_gb:.0f} GB, {100 * r.mean_utilization:.0f}% busy): ask for "
                                  f"{r.accelerator}:{share:g} and save ${saving:,.2f}", saving)


def _fewer(r: RightSizingRequest) -> Suggestion | None:
    if r.gpus < 2:
        return None
    fewer = max(1, math.ceil(r.gpus * r.mean_utilization / TARGET_BUSY - 1e-9))
    if fewer >= r.gpus:
        return None
    saving = r.cost * (1 - fewer / r.gpus)
    return Suggestion("fewer_gpus", f"its {r.gpus} GPUs were {100 * r.mean_utilization:.0f}% busy: {fewer} would have "
                                    f"been {100 * min(r.gpus * r.mean_utilization / fewer, 1.0):.0f}% busy, saving "
                                    f"${saving:,.2f} where its work divides across fewer GPUs", saving)


def _cheaper(r: RightSizingRequest) -> Suggestion | None:
    own_speed = r.speeds.get(r.accelerator)
    best: tuple[float, float, GpuOffer] | None = None
    for offer in r.offers:
        if offer.accelerator == r.accelerator or offer.memory_gb < r.peak_memory_gb * MEMORY_HEADROOM:
            continue
        speed = r.speeds.get(offer.accelerator)
        ratio = own_speed / speed if own_speed and speed else 1.0
        slower = r.mean_utilization * ratio + (1 - r.mean_utilization)
        cost = r.gpu_hours * slower * offer.price_per_gpu_hour
        if best is None or cost < best[0]:
            best = (cost, slower, offer)
    if best is None:
        return None
    cost, slower, offer = best
    source = "measured" if r.speeds_measured else "from the default speed table, not measured"
    pace = f"about {slower:.2f}x as long" if abs(slower - 1) > 0.005 else "as fast"
    return Suggestion("cheaper_gpu", f"{r.gpus}x {offer.accelerator} ({offer.memory_gb:.0f} GB, at least "
                                     f"{MEMORY_HEADROOM:g}x its {r.peak_memory_gb:.1f} GB peak) at "
                                     f"${offer.price_per_gpu_hour:,.2f}/GPU-h would have cost ${cost:,.2f} instead of "
                                     f"${r.cost:,.2f}, running {pace} (speeds {source})", r.cost - cost, slower)
