"""What a fair-share policy is asked and answers (``policies/fair_share.py``): teams, their usage, the
queued gangs, and the decision; all immutable."""

from __future__ import annotations

import math
from dataclasses import dataclass

DEFAULT_WEIGHT = 1.0
EPSILON = 1e-9


@dataclass(frozen=True, slots=True)
class Team:
    name: str
    weight: float = DEFAULT_WEIGHT
    quota_gpus: int | None = None  # guaranteed, as far as its work needs it (in total)
    limit_gpus: int | None = None  # never more, borrowed or not
    parent: str | None = None
    type_quotas: tuple[tuple[str, int], ...] = ()  # (GPU type, GPUs of it guaranteed): policies/fair_share_types.py

    def __post_init__(self) -> None:
        if not (math.isfinite(self.weight) and self.weight > 0):
            raise ValueError(f"team {self.name!r}: weight must be a positive number, got {self.weight!r}")
        for name, value in (("quota_gpus", self.quota_gpus), ("limit_gpus", self.limit_gpus)):
            if value is not None and value < 0:
                raise ValueError(f"team {self.name!r}: {name} must be >= 0, got {value!r}")
        for gpu_type, count in self.type_quotas:
            if count < 0:
                raise ValueError(f"team {self.name!r}: quota_gpus.{gpu_type} must be >= 0, got {count!r}")


@dataclass(frozen=True, slots=True)
class TeamUsage:
    team: str
    held_gpus: int  # GPUs its started gangs hold now (gangs already giving theirs back excluded)
    decayed_gpu_s: float = 0.0  # GPU-seconds it used recently, each second weighted 2^(-age / half-life)
    budget_left: float | None = None  # USD left of an enforced budget this period; None: none enforced
    held_by_type: tuple[tuple[str, int], ...] = ()  # (GPU type, GPUs of it held): for quotas per type


@dataclass(frozen=True, slots=True)
class QueuedGang:
    job_id: str
    team: str
    gpus: int
    priority: int
    order: int  # submission order, lower first
    predicted_cost: float = 0.0  # USD, at the prices being paid
    runtime_s: float | None = None  # predicted run time once started; None: not known
    gpu_type: str | None = None  # its accelerator (A100...), for quotas per type


@dataclass(frozen=True, slots=True)
class FairShareRequest:
    capacity_gpus: int | None  # None: no limit on the fleet, so GPUs are never short
    teams: tuple[Team, ...]
    usage: tuple[TeamUsage, ...]
    queued: tuple[QueuedGang, ...]
    half_life_s: float = 3600.0
    exempt_priority: int | None = 1000
    # (seconds from now, GPUs): when the held GPUs are predicted to be given back; those without a prediction left out
    releases: tuple[tuple[float, int], ...] = ()
    # (team, seconds from now, GPUs): the same predicted ends, each with the team whose gang gives them back; with
    # them a reservation counts the GPUs each team takes again for its share (``policies/backfill.py``)
    team_releases: tuple[tuple[str, float, int], ...] = ()

    def __post_init__(self) -> None:
        if self.capacity_gpus is not None and self.capacity_gpus < 0:
            raise ValueError(f"capacity_gpus must be >= 0, got {self.capacity_gpus!r}")
        if any(not (math.isfinite(in_s) and in_s >= 0 and gpus >= 0) for in_s, gpus in self.releases):
            raise ValueError("releases must be (seconds >= 0, GPUs >= 0) pairs")
        if any(not (math.isfinite(in_s) and in_s >= 0 and gpus >= 0) for _, in_s, gpus in self.team_releases):
            raise ValueError("team_releases must be (team, seconds >= 0, GPUs >= 0)")
        if not (math.isfinite(self.half_life_s) and self.half_life_s > 0):
            raise ValueError(f"half_life_s must be a positive number, got {self.half_life_s!r}")


@dataclass(frozen=True, slots=True)
class Reclaim:
    job_id: str  # the owner's gang that waits for them
    gpus: int  # GPUs to take back beyond those free
    from_teams: tuple[str, ...]  # the borrowers, the most over their share first


@dataclass(frozen=True, slots=True)
class FairShareDecision:
    admit: tuple[str, ...]
    reclaims: tuple[Reclaim, ...] = ()
    waits: tuple[tuple[str, str], ...] = ()  # (job id, why it waits)
    owed: tuple[tuple[str, float], ...] = ()  # team -> GPUs its share is now

    def reason_of(self, job_id: str) -> str | None:
        return dict(self.waits).get(job_id)
