"""Reserving GPUs for a gang that does not fit, and the gangs that may still start before it (backfill).

As Slurm's backfill: a gang that does not fit gets a reservation: ``start_s``, when by the predicted
ends of the gangs holding GPUs enough are free for it, and ``spare``, the GPUs free then beyond its
own. A gang the reservation holds back may start now only if it fits the free GPUs and either ends
before ``start_s`` by its own estimate or fits in the spare (which it then uses up); a gang without
an estimate fits only in the spare. When the holders' ends are not known well enough to name a
start, nothing is reserved and each gang that fits starts, as before. Without a reservation a
large gang waits for a moment when enough GPUs happen to be free, which the small ones after it
keep from coming. Which gang is reserved for, and which gangs it holds back, is the policy's choice
(``policies/fair_share.py``: the one waiting longest; it holds back only gangs that would borrow).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

EPSILON = 1e-9


@dataclass
class Reservation:
    job_id: str
    gpus: int
    start_s: float  # from now
    spare: float  # GPUs free at start_s beyond the reserved gang's

    def allows(self, gpus: int, runtime_s: float | None) -> bool:
        """Whether a gang that fits the free GPUs now may start without delaying the reserved one."""
        return self.ends_first(runtime_s) or gpus <= self.spare + EPSILON

    def ends_first(self, runtime_s: float | None) -> bool:
        return runtime_s is not None and runtime_s <= self.start_s + EPSILON

    def use(self, gpus: int, runtime_s: float | None) -> None:
        if not self.ends_first(runtime_s):
            self.spare -= gpus

    def why(self) -> str:
        return (f"waiting: the free GPUs are reserved for {self.job_id} ({self.gpus} GPUs), which starts first, "
                f"in about {math.ceil(self.start_s / 60):.0f} min")


def reserve(job_id: str, gpus: int, free: float, releases: Iterable[tuple[float, int]]) -> Reservation | None:
    """The reservation for a gang of ``gpus`` when ``free`` GPUs are free now and ``releases`` are the
    (seconds from now, GPUs) the holders are predicted to give back; None when they do not add up to it."""
    available = free
    for in_s, count in sorted(releases):
        if not math.isfinite(in_s):
            break
        available += count
        if available + EPSILON >= gpus:
            return Reservation(job_id, gpus, max(in_s, 0.0), available - gpus)
    return None
