"""Quotas per GPU type: ``quota_gpus: {A100: 4}`` guarantees a team four A100s while it has A100 work.

A gang of a type its team has a quota of, while the team's gangs of that type (held, admitted, and
this one) stay within it, counts as within its team's share, whatever the team holds of other types:
it goes before the gangs that would borrow, and when it does not fit, it takes GPUs of its type back
from the teams holding that type past their own quota of it (past nothing, for a team without one),
the team most over its whole share first. A gang past its type's quota, or of a type without one,
goes by the team's weighted share as any other.
"""

from __future__ import annotations

from policies.fair_share_books import Books
from policies.fair_share_request import QueuedGang


def type_quota(books: Books, team: str, gpu_type: str | None) -> int | None:
    known = books.teams.get(team)
    if known is None or gpu_type is None:
        return None
    return dict(known.type_quotas).get(gpu_type)


def within_type_quota(books: Books, gang: QueuedGang) -> bool:
    quota = type_quota(books, gang.team, gang.gpu_type)
    if quota is None:
        return False
    key = (gang.team, gang.gpu_type or "")
    return books.held_type.get(key, 0) + books.admitted_type[key] + gang.gpus <= quota


def reclaim_by_type(books: Books, owed: dict[str, float], gang: QueuedGang, usable: int) -> bool:
    """Take GPUs of the gang's type back for it, or hold it with why; True if reclaimed."""
    gpu_type = gang.gpu_type or ""
    need = gang.gpus - usable
    spare: dict[str, int] = {}
    for (team, kind), held in books.held_type.items():
        if kind == gpu_type and team != gang.team:
            spare[team] = held - books.given_back_type[(team, kind)] - (type_quota(books, team, kind) or 0)
    over = {t: books.held.get(t, 0) - books.given_back[t] - owed.get(t, 0.0) for t in spare}
    borrowers = sorted((t for t, n in spare.items() if n >= 1), key=lambda t: (-over[t], t))
    if sum(spare[t] for t in borrowers) < need:
        books.hold(gang, f"waiting: for {gpu_type} GPUs (within team {gang.team}'s {gpu_type} quota; every team "
                         f"holding them is within its own)")
        return False
    taken = books.take_back(gang, need, borrowers, spare, gpu_type)
    books.hold(gang, f"waiting: reclaiming {need} {gpu_type} GPU{'s' if need != 1 else ''} from team "
                     f"{', '.join(taken)}")
    books.admitted[gang.team] += gang.gpus
    books.admitted_type[(gang.team, gpu_type)] += gang.gpus
    books.free = max(books.free - usable, 0.0)
    if books.reservation is not None:
        books.reservation.spare -= usable
    return True
