"""What a fair-share decision has given out so far (``policies/fair_share.py``): admitted, held back,
reclaimed, per team and per GPU type; one ``Books`` per decision, never shared."""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass, field

from policies.backfill import Reservation
from policies.fair_share_request import EPSILON, FairShareRequest, QueuedGang, Reclaim, Team


@dataclass
class Books:
    """What the policy has given out so far in one decision."""

    request: FairShareRequest
    teams: dict[str, Team]
    held: dict[str, int]
    budget: dict[str, float | None]
    free: float
    admitted: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    given_back: dict[str, int] = field(default_factory=lambda: defaultdict(int))  # reclaimed from it
    held_type: dict[tuple[str, str], int] = field(default_factory=dict)  # (team, GPU type) -> GPUs held
    admitted_type: dict[tuple[str, str], int] = field(default_factory=lambda: defaultdict(int))
    given_back_type: dict[tuple[str, str], int] = field(default_factory=lambda: defaultdict(int))
    admit: list[str] = field(default_factory=list)
    waits: list[tuple[str, str]] = field(default_factory=list)
    reclaims: list[Reclaim] = field(default_factory=list)
    releases: list[tuple[float, int]] = field(default_factory=list)
    reservation: Reservation | None = None  # for the gang waiting longest, when it does not fit
    _ancestors: dict[str, list[str]] = field(default_factory=dict)

    def ancestors(self, team: str) -> list[str]:
        """The team, its parent, the parent's parent... (cached: the same through one decision)."""
        if team not in self._ancestors:
            chain, seen = [team], {team}
            while (known := self.teams.get(chain[-1])) is not None and (parent := known.parent) is not None \
                    and parent not in seen:
                chain.append(parent)
                seen.add(parent)
            self._ancestors[team] = chain
        return self._ancestors[team]

    def subtree_total(self, team: str, of: dict[str, int]) -> int:
        return sum(n for t, n in of.items() if team in self.ancestors(t))

    def over_limit(self, gang: QueuedGang) -> str | None:
        for team in self.ancestors(gang.team):
            known = self.teams.get(team)
            limit = known.limit_gpus if known is not None else None
            if limit is None:
                continue
            total = self.subtree_total(team, self.held) + self.subtree_total(team, self.admitted) + gang.gpus
            if total > limit:
                return f"waiting: team {team} at its limit of {limit} GPUs"
        return None

    def over_budget(self, gang: QueuedGang) -> str | None:
        left = self.budget.get(gang.team)
        if left is None:
            return None
        if left <= 0 or gang.predicted_cost > left + EPSILON:
            return (f"waiting: budget: team {gang.team} has ${max(left, 0.0):.2f} left this period, "
                    f"the job is predicted to cost ${gang.predicted_cost:.2f}")
        return None

    def take(self, gang: QueuedGang) -> None:
        self.admit.append(gang.job_id)
        self.admitted[gang.team] += gang.gpus
        if gang.gpu_type is not None:
            self.admitted_type[(gang.team, gang.gpu_type)] += gang.gpus
        self.free = max(self.free - gang.gpus, 0.0)
        if gang.runtime_s is not None:
            self.releases.append((gang.runtime_s, gang.gpus))
        if self.reservation is not None:
            self.reservation.use(gang.gpus, gang.runtime_s)
        left = self.budget.get(gang.team)
        if left is not None:
            self.budget[gang.team] = left - gang.predicted_cost

    def hold(self, gang: QueuedGang, why: str) -> None:
        self.waits.append((gang.job_id, why))

    def take_or_hold(self, gang: QueuedGang, why: str | None) -> None:
        """Hold the gang with ``why``; with none, take it if it fits the GPUs still free, else hold it."""
        if why is not None:
            self.hold(gang, why)
        elif gang.gpus <= self.free + EPSILON:
            self.take(gang)
        else:
            self.hold(gang, "waiting: for GPUs")

    def take_back(self, gang: QueuedGang, need: int, borrowers: list[str], spare: dict[str, int],
                  gpu_type: str | None = None) -> list[str]:
        """Reclaim ``need`` GPUs (of ``gpu_type``, if given) for the gang from the borrowers in order, each
        giving at most its spare; the teams taken from."""
        taken, left = [], need
        for team in borrowers:
            if left <= 0:
                break
            give = min(spare[team], left)
            if gpu_type is not None:
                self.given_back_type[(team, gpu_type)] += give
            self.given_back[team] += give
            left -= give
            taken.append(team)
        self.reclaims.append(Reclaim(gang.job_id, need, tuple(taken)))
        return taken


def books_for(request: FairShareRequest) -> Books:
    teams = {t.name: t for t in request.teams}
    held = {u.team: u.held_gpus for u in request.usage}
    budget = {u.team: u.budget_left for u in request.usage}
    capacity = math.inf if request.capacity_gpus is None else float(request.capacity_gpus)
    return Books(request, teams, held, budget, max(capacity - sum(held.values()), 0.0),
                  releases=list(request.releases),
                  held_type={(u.team, t): n for u in request.usage for t, n in u.held_by_type})
