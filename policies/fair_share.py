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
- **kept**: a gang that would borrow takes only the free GPUs beyond those the teams' waiting gangs
  within their share would take (per team, its gangs in order while they fit in what its share leaves).
  A team whose next gang is past its share is asked among the borrowers, but its gangs behind it
  that fit its share are still owed those GPUs: without this a borrower asked first takes them, and
  the team takes them back by a reclaim a step later (a checkpoint and a restart for nothing).
- **reserve**: the gang waiting longest (by priority, then submission, as FIFO takes them) gets a
  reservation: when the predicted ends of the running gangs free enough for it. With each end's team
  (``team_releases``) the plan counts what every team starts again for its share as its gangs end
  (so the time named is when the gang can really start, now included: its free GPUs are then kept
  for it); with the ends alone (``releases``) it is planned only when the gang does not fit the free
  GPUs, from the ends as they are. A gang that would borrow starts before it only if it ends before
  then by its own estimate (``runtime_s``) or fits in what the reservation leaves spare; a gang within
  its team's share is never held back by it (``policies/backfill.py``). Without it, a large gang
  waits for a moment when enough GPUs happen to be free, which the small ones keep from coming.
  With each end's team known, a gang larger than its team's whole share (it can only borrow) starts
  only as the gang waiting longest, or when it ends before the reservation: started whenever it
  happens to fit, it would be taken back as soon as the teams within their share want their GPUs
  again, and wait anew (a gang larger than the fleet is never the one reserved for).
- **per GPU type**: a quota per type (``Team.type_quotas``) is guaranteed per type: a gang within it
  counts as within its team's share, and takes back only GPUs of its type (``policies/fair_share_types.py``).
- **reclaim**: a gang that does not fit, whose team would stay within its share, takes GPUs back
  from the teams holding more than theirs (the most over first); the caller picks the borrowers'
  gangs to checkpoint, the smallest first, then the least work lost (``policies/preemption.py``),
  and requeues them.
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
from typing import Protocol

from policies.backfill import Reservation, reserve, reserve_among_teams
from policies.fair_share_books import Books, books_for
from policies.fair_share_request import DEFAULT_WEIGHT as DEFAULT_WEIGHT
from policies.fair_share_request import EPSILON as EPSILON
from policies.fair_share_request import FairShareDecision as FairShareDecision
from policies.fair_share_request import FairShareRequest as FairShareRequest
from policies.fair_share_request import QueuedGang as QueuedGang
from policies.fair_share_request import Reclaim as Reclaim
from policies.fair_share_request import Team as Team
from policies.fair_share_request import TeamUsage as TeamUsage
from policies.fair_share_types import reclaim_by_type, within_type_quota
from policies.registry import Registry


class FairSharePolicy(Protocol):
    """Which queued gangs to admit now, which wait and why, and what to reclaim for whom."""

    def __call__(self, request: FairShareRequest, /) -> FairShareDecision: ...


FAIR_SHARE_POLICIES: Registry[FairSharePolicy] = Registry("fair_share")



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


def _below_share(books: Books, owed: dict[str, float], gang: QueuedGang) -> bool:
    """Whether the team stays within its share (or its quota of the gang's GPU type) with this gang: those teams
    go before any that would borrow."""
    return books.held.get(gang.team, 0) + books.admitted[gang.team] + gang.gpus <= owed.get(gang.team, 0.0) + EPSILON \
        or within_type_quota(books, gang)


def _standing(books: Books, owed: dict[str, float], usage: dict[str, float], totals: tuple[float, float],
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
    books = books_for(request)
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
    if oldest is not None and request.team_releases and request.capacity_gpus is not None:
        # Its GPUs are kept for it from now, even when free now: a borrower asked first takes none of them.
        books.reservation = _reserve_among_teams(books, owed, queues, oldest)
    elif oldest is not None and oldest.gpus > books.free + EPSILON:
        books.reservation = reserve(oldest.job_id, oldest.gpus, books.free, books.releases)
    kept = _kept(books, owed, queues)
    while heap:
        _, team = heapq.heappop(heap)
        gang = queues[team].pop(0)
        within = _below_share(books, owed, gang)
        if within:
            kept[team] = max(kept[team] - gang.gpus, 0)
        why = books.over_budget(gang) or books.over_limit(gang)
        exempt = request.exempt_priority is not None and gang.priority >= request.exempt_priority
        # The reservation stops borrowing only: a gang its team's share covers is never held back by it.
        blocking = books.reservation
        if blocking is not None and (blocking.job_id == gang.job_id or within
                                     or blocking.allows(gang.gpus, gang.runtime_s)):
            blocking = None
        if why is not None:
            books.hold(gang, why)
        elif exempt:
            books.take(gang)
        elif gang.gpus <= books.free + EPSILON and not within \
                and gang.gpus > books.free - sum(kept.values()) + EPSILON:
            books.hold(gang, f"waiting: {sum(kept.values())} of the free GPUs are kept for the waiting jobs of teams "
                             "within their share")
        elif gang.gpus <= books.free + EPSILON:
            if blocking is None and _waits_its_turn(books, owed, gang):
                books.hold(gang, f"waiting: its {gang.gpus} GPUs are more than team {gang.team}'s share of "
                                 f"{owed.get(gang.team, 0.0):g}; it borrows them once it is the job waiting longest")
            elif blocking is None:
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


def _reserve_among_teams(books: Books, owed: dict[str, float], queues: dict[str, list[QueuedGang]],
                         oldest: QueuedGang) -> Reservation | None:
    """The oldest gang's reservation when the held GPUs' ends are known per team: what each team takes again
    for its share as its gangs end is not counted as coming free for it (``policies/backfill.py``)."""
    # A gang larger than its team's whole share starts only by borrowing: it takes nothing back for the share.
    queued = {team: sum(g.gpus for g in gangs if g.job_id != oldest.job_id and g.gpus <= owed.get(team, 0.0) + EPSILON)
              for team, gangs in queues.items()}
    wanted = {team: min(owed.get(team, 0.0), books.held.get(team, 0) + queued.get(team, 0))
              for team in set(owed) | set(books.held)}
    capacity = float(books.request.capacity_gpus or 0)
    return reserve_among_teams(oldest.job_id, oldest.gpus, capacity, books.held, wanted, queued,
                               books.request.team_releases)


def _kept(books: Books, owed: dict[str, float], queues: dict[str, list[QueuedGang]]) -> dict[str, int]:
    """Per team, the GPUs its waiting gangs would take within its share: its gangs in its queue's order, each
    while it fits in what the share leaves past what the team holds (a gang that does not is passed over)."""
    kept: dict[str, int] = defaultdict(int)
    for team, gangs in queues.items():
        room = owed.get(team, 0.0) - books.held.get(team, 0)
        for gang in gangs:
            if kept[team] + gang.gpus <= room + EPSILON:
                kept[team] += gang.gpus
    return kept


def _waits_its_turn(books: Books, owed: dict[str, float], gang: QueuedGang) -> bool:
    """With each end's team known, a gang larger than its team's whole share (it can only borrow) starts only
    as the gang waiting longest, through its reservation, or when it ends before that reservation starts:
    started whenever it happens to fit, it is taken back as soon as the teams within their share want their
    GPUs again, and waits anew."""
    reserved = books.reservation
    return bool(books.request.team_releases) and gang.gpus > owed.get(gang.team, 0.0) + EPSILON \
        and (reserved is None or (reserved.job_id != gang.job_id and not reserved.ends_first(gang.runtime_s)))


def _oldest(books: Books, request: FairShareRequest) -> QueuedGang | None:
    """The gang FIFO would take first among those only GPUs keep waiting (not exempt, within budget and limits)."""
    exempt = request.exempt_priority
    capacity = math.inf if request.capacity_gpus is None else request.capacity_gpus
    for gang in sorted(request.queued, key=lambda g: (-g.priority, g.order, g.job_id)):
        if (exempt is None or gang.priority < exempt) and gang.gpus <= capacity and books.over_budget(gang) is None \
                and books.over_limit(gang) is None:
            return gang
    return None


def _reclaim_or_wait(books: Books, owed: dict[str, float], gang: QueuedGang) -> bool:
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
    taken = books.take_back(gang, need, borrowers, spare)
    books.hold(gang, f"waiting: reclaiming {need} GPU{'s' if need != 1 else ''} from team {', '.join(taken)}")
    books.admitted[gang.team] += gang.gpus
    if gang.gpu_type is not None:
        books.admitted_type[(gang.team, gang.gpu_type)] += gang.gpus
    books.free = 0.0
    if books.reservation is not None:
        books.reservation.spare -= usable
    return True
