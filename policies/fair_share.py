"""Fair share across teams: which queued gangs to admit now, and from whom to take borrowed GPUs back.

Every policy is ``policy(request: FairShareRequest) -> FairShareDecision``, pure.

``weighted_fair_share`` (the default):

- **owed**: the fleet's GPUs are divided among the teams that have work (held or queued) by weight,
  each first given its guaranteed quota (as far as its work needs it), never more than its work or
  its limit, what one team cannot use going to the others (weighted max-min, "water filling"). A
  team with a ``parent`` shares in its parent's part, divided among the parent's children the same
  way; a parent's own jobs count as one more child of weight 1.
- **order**: queued gangs are taken team by team: first the teams that stay within their share with
  their next gang, then those that would borrow; among each, the team furthest below its share
  first: the lower its standing, the mean of (GPUs held and admitted / GPUs owed) and (its recent usage,
  decayed with a half-life, / the usage its share would have given it), so a team that was idle is
  not punished for it; within a team, higher priority first, then the earlier submission.
- **admit**: a gang that fits the free GPUs is admitted, even past its team's share (it borrows
  what others leave unused), unless its team (or an ancestor) would pass its limit or its budget.
- **reserve**: the gang waiting longest (by priority, then submission, as FIFO takes them), when it
  does not fit the free GPUs, gets a reservation: when the predicted ends of the running gangs
  (``releases``) free enough for it. A gang that would borrow starts before it only if it ends before
  then by its own estimate (``runtime_s``) or fits in what the reservation leaves spare; a gang within
  its team's share is never held back by it (``policies/backfill.py``). Without it, a large gang
  waits for a moment when enough GPUs happen to be free, which the small ones keep from coming.
- **per GPU type**: a quota per type (``Team.type_quotas``) is guaranteed per type: a gang within it
  counts as within its team's share, and takes back only GPUs of its type (``policies/fair_share_types.py``).
- **reclaim**: a gang that does not fit, whose team would stay within its share, takes GPUs back
  from the teams holding more than theirs (the most over first); the caller picks the borrowers'
  gangs to checkpoint by the least work lost and requeues them.
- gangs at or above ``exempt_priority`` (``inference``) are admitted whatever the shares: the
  in-cluster preemption by priority still applies to them.

``fifo`` (today's behaviour: priority, then submission, admitted while they fit) and
``static_quota`` (each team a fixed part of the fleet, by quota or weight, no borrowing) are the
baselines (``policies/fair_share_baselines.py``); budgets hold under every policy.
"""

from __future__ import annotations

import heapq
import math
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Protocol

from policies.backfill import Reservation, reserve
from policies.fair_share_types import reclaim_by_type, within_type_quota
from policies.registry import Registry

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

    def __post_init__(self) -> None:
        if self.capacity_gpus is not None and self.capacity_gpus < 0:
            raise ValueError(f"capacity_gpus must be >= 0, got {self.capacity_gpus!r}")
        if any(not (math.isfinite(in_s) and in_s >= 0 and gpus >= 0) for in_s, gpus in self.releases):
            raise ValueError("releases must be (seconds >= 0, GPUs >= 0) pairs")
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


class FairSharePolicy(Protocol):
    """Which queued gangs to admit now, which wait and why, and what to reclaim for whom."""

    def __call__(self, request: FairShareRequest, /) -> FairShareDecision: ...


FAIR_SHARE_POLICIES: Registry[FairSharePolicy] = Registry("fair_share")


@dataclass
class _Books:
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


def _books(request: FairShareRequest) -> _Books:
    teams = {t.name: t for t in request.teams}
    held = {u.team: u.held_gpus for u in request.usage}
    budget = {u.team: u.budget_left for u in request.usage}
    capacity = math.inf if request.capacity_gpus is None else float(request.capacity_gpus)
    return _Books(request, teams, held, budget, max(capacity - sum(held.values()), 0.0),
                  releases=list(request.releases),
                  held_type={(u.team, t): n for u in request.usage for t, n in u.held_by_type})


def _queues(request: FairShareRequest) -> dict[str, list[QueuedGang]]:
    queues: dict[str, list[QueuedGang]] = defaultdict(list)
    for gang in sorted(request.queued, key=lambda g: (-g.priority, g.order, g.job_id)):
        queues[gang.team].append(gang)
    return queues


def water_fill(capacity: float, claims: list[tuple[str, float, float, float]]) -> dict[str, float]:
    """``capacity`` divided among ``(name, weight, floor, cap)`` claims by weight, each given at least its
    floor (floors past the capacity scaled down alike) and never past its cap, what a capped claim
    cannot take going to the others: each gets ``min(cap, max(floor, weight * level))`` for the one
    level that gives out the capacity (or everything the caps allow)."""
    if not claims:
        return {}
    caps = {name: max(cap, 0.0) for name, _, _, cap in claims}
    floors = {name: min(floor, caps[name]) for name, _, floor, _ in claims}
    total_floor = sum(floors.values())
    if total_floor >= capacity:
        scale = capacity / total_floor if total_floor > 0 else 0.0
        return {name: floors[name] * scale for name in floors}
    if sum(caps.values()) <= capacity:
        return caps

    def given(level: float) -> dict[str, float]:
        return {name: min(caps[name], max(floors[name], weight * level)) for name, weight, _, _ in claims}

    low, high = 0.0, capacity / min(weight for _, weight, _, _ in claims)
    for _ in range(100):
        mid = (low + high) / 2
        low, high = (mid, high) if sum(given(mid).values()) < capacity else (low, mid)
    return given(high)


def owed_shares(request: FairShareRequest) -> dict[str, float]:
    """GPUs each team with work is owed now (teams without work are owed nothing: others borrow it)."""
    teams = {t.name: t for t in request.teams}
    demand: dict[str, float] = defaultdict(float)
    for usage in request.usage:
        demand[usage.team] += usage.held_gpus
    for gang in request.queued:
        demand[gang.team] += gang.gpus
    children: dict[str | None, list[str]] = defaultdict(list)
    for name, team in teams.items():
        children[team.parent if team.parent in teams else None].append(name)
    for name in demand:
        if name not in teams:
            children[None].append(name)

    def subtree_demand(name: str) -> float:
        return demand.get(name, 0.0) + sum(subtree_demand(c) for c in children.get(name, []))

    owed: dict[str, float] = {}

    def divide(capacity: float, parent: str | None) -> None:
        members = list(children.get(parent, []))
        claims: list[tuple[str, float, float, float]] = []
        for name in members:
            team = teams.get(name, Team(name))
            want = subtree_demand(name)
            if want <= 0:
                continue
            cap = want if team.limit_gpus is None else min(want, team.limit_gpus)
            claims.append((name, team.weight, float(team.quota_gpus or 0), cap))
        own = f"{parent}\0own" if parent is not None else None
        if own is not None and demand.get(parent or "", 0.0) > 0:
            claims.append((own, DEFAULT_WEIGHT, 0.0, demand[parent or ""]))
        for name, given in water_fill(capacity, claims).items():
            if name == own:
                owed[parent or ""] = owed.get(parent or "", 0.0) + given
                continue
            if children.get(name):
                divide(given, name)
            else:
                owed[name] = owed.get(name, 0.0) + given

    total = float(request.capacity_gpus) if request.capacity_gpus is not None else sum(demand.values())
    divide(total, None)
    return owed


def _below_share(books: _Books, owed: dict[str, float], gang: QueuedGang) -> bool:
    """Whether the team stays within its share (or its quota of the gang's GPU type) with this gang: those teams
    go before any that would borrow."""
    return books.held.get(gang.team, 0) + books.admitted[gang.team] + gang.gpus <= owed.get(gang.team, 0.0) + EPSILON \
        or within_type_quota(books, gang)


def _standing(books: _Books, owed: dict[str, float], usage: dict[str, float], totals: tuple[float, float],
              team: str) -> float:
    """How far the team is from its share: 0 far below, 1 at it (lower goes first). ``totals``: all teams'
    usage and GPUs owed, the same through one decision."""
    held = books.held.get(team, 0) + books.admitted[team]
    mine = owed.get(team, 0.0)
    by_held = held / mine if mine > EPSILON else math.inf
    total_usage, total_owed = totals
    if total_usage <= EPSILON or total_owed <= EPSILON:
        return by_held
    by_usage = (usage.get(team, 0.0) / total_usage) / max(mine / total_owed, EPSILON)
    return (by_held + by_usage) / 2 if math.isfinite(by_held) else math.inf


@FAIR_SHARE_POLICIES.register("weighted_fair_share", default=True)
def weighted_fair_share(request: FairShareRequest) -> FairShareDecision:
    books = _books(request)
    owed = owed_shares(request)
    usage = {u.team: u.decayed_gpu_s for u in request.usage}
    totals = (sum(usage.values()), sum(owed.values()))
    queues = _queues(request)

    def key(team: str) -> tuple[bool, float, int, int, str]:
        head = queues[team][0]
        return (not _below_share(books, owed, head), _standing(books, owed, usage, totals, team), -head.priority,
                head.order, team)

    # A team's place changes only when one of its own gangs is decided: a heap, each team in it once.
    heap = [(key(team), team) for team in queues]
    heapq.heapify(heap)
    oldest = _oldest(books, request)
    if oldest is not None and oldest.gpus > books.free + EPSILON:
        books.reservation = reserve(oldest.job_id, oldest.gpus, books.free, books.releases)
    while heap:
        _, team = heapq.heappop(heap)
        gang = queues[team].pop(0)
        why = books.over_budget(gang) or books.over_limit(gang)
        exempt = request.exempt_priority is not None and gang.priority >= request.exempt_priority
        # The reservation stops borrowing only: a gang its team's share covers is never held back by it.
        blocking = books.reservation
        if blocking is not None and (blocking.job_id == gang.job_id or _below_share(books, owed, gang)
                                     or blocking.allows(gang.gpus, gang.runtime_s)):
            blocking = None
        if why is not None:
            books.hold(gang, why)
        elif exempt:
            books.take(gang)
        elif gang.gpus <= books.free + EPSILON:
            if blocking is None:
                books.take(gang)
            else:
                books.hold(gang, blocking.why())
        elif _reclaim_or_wait(books, owed, gang) and books.reservation is not None \
                and books.reservation.job_id == gang.job_id:
            books.reservation = None  # it takes borrowed GPUs back instead
        if queues[team]:
            heapq.heappush(heap, (key(team), team))
    return FairShareDecision(tuple(books.admit), tuple(books.reclaims), tuple(books.waits),
                             tuple(sorted(owed.items())))


def _oldest(books: _Books, request: FairShareRequest) -> QueuedGang | None:
    """The gang FIFO would take first among those only GPUs keep waiting (not exempt, within budget and limits)."""
    exempt = request.exempt_priority
    for gang in sorted(request.queued, key=lambda g: (-g.priority, g.order, g.job_id)):
        if (exempt is None or gang.priority < exempt) and books.over_budget(gang) is None \
                and books.over_limit(gang) is None:
            return gang
    return None


def _reclaim_or_wait(books: _Books, owed: dict[str, float], gang: QueuedGang) -> bool:
    """Reclaim borrowed GPUs for a gang that does not fit (with the free ones), or hold it with why; True if
    reclaimed."""
    usable = math.floor(books.free + EPSILON)
    if within_type_quota(books, gang):
        return reclaim_by_type(books, owed, gang, usable)
    held = books.held.get(gang.team, 0) + books.admitted[gang.team]
    mine = owed.get(gang.team, 0.0)
    if held + gang.gpus > mine + EPSILON:
        if gang.gpus > mine + EPSILON:
            books.hold(gang, f"waiting: its {gang.gpus} GPUs are more than team {gang.team}'s share of {mine:g}; "
                             "it starts when that many are free")
        else:
            books.hold(gang, f"waiting: team {gang.team} over its share (holds {held} of {mine:g} GPUs owed)")
        return False
    need = gang.gpus - usable
    # What each other team holds past its share, in whole GPUs (a part of one counts: 4 GPUs among 3
    # teams owe each 1.33, and the team holding 2 gives one back to the team holding none).
    # Only running gangs give GPUs back, so only what a team held at the start counts.
    spare = {t: math.ceil(held_gpus - books.given_back[t] - owed.get(t, 0.0) - EPSILON)
             for t, held_gpus in books.held.items() if t != gang.team}
    borrowers = sorted((t for t, n in spare.items() if n >= 1), key=lambda t: (-spare[t], t))
    if sum(spare[t] for t in borrowers) < need:
        books.hold(gang, "waiting: for GPUs (every team is within its share)")
        return False
    taken, left = [], need
    for team in borrowers:
        if left <= 0:
            break
        give = min(spare[team], left)
        books.given_back[team] += give
        left -= give
        taken.append(team)
    books.reclaims.append(Reclaim(gang.job_id, need, tuple(taken)))
    books.hold(gang, f"waiting: reclaiming {need} GPU{'s' if need != 1 else ''} from team {', '.join(taken)}")
    books.admitted[gang.team] += gang.gpus
    if gang.gpu_type is not None:
        books.admitted_type[(gang.team, gang.gpu_type)] += gang.gpus
    books.free = 0.0
    if books.reservation is not None:
        books.reservation.spare -= usable
    return True
