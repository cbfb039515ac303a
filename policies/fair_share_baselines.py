"""The fair-share baselines: ``fifo`` (today's engine) and ``static_quota`` (fixed parts, no borrowing).

Both are pure ``policy(FairShareRequest) -> FairShareDecision``, registered in the fair-share
registry; budgets and limits hold under them as under ``weighted_fair_share``.
"""

from __future__ import annotations

import math

from policies.fair_share import FAIR_SHARE_POLICIES
from policies.fair_share_books import books_for
from policies.fair_share_request import EPSILON, FairShareDecision, FairShareRequest, Team


@FAIR_SHARE_POLICIES.register("fifo")
def fifo(request: FairShareRequest) -> FairShareDecision:
    """Today's engine: priority, then submission, each admitted while it fits; budgets and limits hold."""
    books = books_for(request)
    for gang in sorted(request.queued, key=lambda g: (-g.priority, g.order, g.job_id)):
        books.take_or_hold(gang, books.over_budget(gang) or books.over_limit(gang))
    return FairShareDecision(tuple(books.admit), (), tuple(books.waits))


@FAIR_SHARE_POLICIES.register("static_quota")
def static_quota(request: FairShareRequest) -> FairShareDecision:
    """Each team a fixed part of the fleet (its quota, else by weight among the teams named or with
    work), never more: nothing borrowed, so nothing reclaimed."""
    books = books_for(request)
    names = sorted({t.name for t in request.teams} | {u.team for u in request.usage}
                   | {g.team for g in request.queued})
    capacity = request.capacity_gpus
    fixed: dict[str, float] = {}
    if capacity is not None:
        unquoted = [n for n in names if books.teams.get(n, Team(n)).quota_gpus is None]
        quoted = sum(books.teams[n].quota_gpus or 0 for n in names if n not in unquoted)
        weights = sum(books.teams.get(n, Team(n)).weight for n in unquoted)
        for n in names:
            team = books.teams.get(n, Team(n))
            fixed[n] = float(team.quota_gpus) if team.quota_gpus is not None else (
                max(capacity - quoted, 0) * team.weight / weights)
    for gang in sorted(request.queued, key=lambda g: (-g.priority, g.order, g.job_id)):
        why = books.over_budget(gang) or books.over_limit(gang)
        held = books.held.get(gang.team, 0) + books.admitted[gang.team]
        if why is None and capacity is not None and held + gang.gpus > math.floor(fixed[gang.team] + EPSILON):
            why = f"waiting: team {gang.team} at its fixed part of {math.floor(fixed[gang.team] + EPSILON)} GPUs"
        books.take_or_hold(gang, why)
    return FairShareDecision(tuple(books.admit), (), tuple(books.waits),
                             tuple(sorted(fixed.items())))
