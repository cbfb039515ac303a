"""Reserving GPUs for a gang that does not fit, and the gangs that may still start before it (backfill).

As Slurm's backfill: a gang that does not fit gets a reservation: ``start_s``, when by the predicted
ends of the gangs holding GPUs enough are free for it, and ``spare``, the GPUs free then beyond its
own. A gang the reservation holds back may start now only if it fits the free GPUs and either ends
before ``start_s`` by its own estimate or fits in the spare (which it then uses up); a gang without
an estimate fits only in the spare. When the holders' ends are not known well enough to name a
start, nothing is reserved and each gang that fits starts, as before. When each end's team is known
(``reserve_among_teams``), the GPUs a team starts again for its own share as its gangs end are not
counted as coming free, so ``start_s`` is when the gang can really start. Without a reservation a
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


def reserve_among_teams(job_id: str, gpus: int, capacity: float, held: dict[str, int], wanted: dict[str, float],
                        queued: dict[str, int], releases: Iterable[tuple[str, float, int]]) -> Reservation | None:
    """The reservation for a gang of ``gpus`` on a fleet of ``capacity`` when the teams' own shares come first:
    each team, as its gangs end (``releases``: team, seconds from now, GPUs), starts its ``queued`` GPUs again
    until it holds what it is ``wanted`` (its share, as far as its work needs it), so only what no team takes
    back for its share adds up to the reservation. ``start_s`` is the first moment (now, or a predicted end)
    at which the GPUs no team holds or takes back are enough; None when they never are by the known ends."""
    holding = {team: float(n) for team, n in held.items()}

    def free() -> float:
        claims = 0.0
        for team in set(holding) | set(wanted):
            mine = holding.get(team, 0.0)
            claims += max(mine, min(wanted.get(team, 0.0), mine + queued.get(team, 0)))
        return capacity - claims

    at, available = 0.0, free()
    for team, in_s, count in sorted(releases, key=lambda r: (r[1], r[0])):
        if available + EPSILON >= gpus:
            break
        if not math.isfinite(in_s):
            return None
        holding[team] = max(holding.get(team, 0.0) - count, 0.0)  # never below nothing, whatever the ends say
        at, available = max(in_s, 0.0), free()
    if available + EPSILON < gpus:
        return None
    return Reservation(job_id, gpus, at, available - gpus)
