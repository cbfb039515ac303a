"""Backfill: the clouds' own price history in the price book, so a broker that just started (or a
team that wants to simulate its jobs on its own regions) has weeks of market behind it.

AWS gives every spot price change (``DescribeSpotPriceHistory``, 90 days back); GCP gives a daily
Spot price and preemption rate per machine type and zone (``advice.capacityHistory``, 30 days).
A price source that can read its history has ``history(since)`` (``providers/aws.py``,
``providers/gcp.py``). With ``price_backfill_days`` set, a process's first successful poll of
such a cloud reads that many days and stores them before the first quote the book already has of
each offer (``insert_history``): what the broker polled itself is never rewritten. The history
says nothing of how many nodes could be had, so a backfilled stretch counts as spot capacity
available wherever a price was quoted (as ``--export-trace`` reads any quote without a count).
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from broker.market.rows import quote_row
from broker.store.tables import PriceQuoteRow
from providers.base import SpotQuote

_done: set[tuple[int, str]] = set()  # (book, cloud) backfilled by this process
_lock = threading.Lock()


def insert_history(s: Session, cloud: str, quotes: Sequence[SpotQuote]) -> int:
    """Rows for ``quotes`` older than the first row of their offer; consecutive equal quotes are one
    row, each holding until the next. Returns the rows inserted."""
    first = {(c, z, t): when for c, z, t, when in s.execute(
        select(PriceQuoteRow.cloud, PriceQuoteRow.zone, PriceQuoteRow.instance_type,
               func.min(PriceQuoteRow.observed_at)).where(PriceQuoteRow.cloud == cloud)
        .group_by(PriceQuoteRow.cloud, PriceQuoteRow.zone, PriceQuoteRow.instance_type))}
    by_offer: dict[tuple[str, str, str], list[SpotQuote]] = {}
    for q in quotes:
        if q.cloud != cloud:
            raise ValueError(f"backfill({cloud!r}): got a quote for cloud {q.cloud!r}")
        by_offer.setdefault((q.cloud, q.zone, q.instance_type), []).append(q)
    inserted = 0
    for key, found in by_offer.items():
        bound = first.get(key)
        bound = None if bound is None else (bound if bound.tzinfo else bound.replace(tzinfo=UTC))
        ordered = sorted((q for q in found if bound is None or q.observed_at < bound), key=lambda q: q.observed_at)
        kept = [q for i, q in enumerate(ordered) if i == 0 or not _same(ordered[i - 1], q)]
        for i, q in enumerate(kept):
            until = kept[i + 1].observed_at if i + 1 < len(kept) else (bound or q.observed_at)
            s.add(quote_row(q, q.observed_at, until))
            inserted += 1
    return inserted


def _same(a: SpotQuote, b: SpotQuote) -> bool:
    return (a.spot_price, a.on_demand_price, a.preemption_rate) == (b.spot_price, b.on_demand_price, b.preemption_rate)


def backfill_once(book: Any, cloud: str, source: Any, days: float, force: bool = False) -> str | None:
    """After a successful poll: read ``days`` of ``source``'s history into ``book``, once per book
    and cloud in this process (``force``: again). Returns a line saying what it did, None when
    there was nothing to do; never raises (the poll's prices are already stored)."""
    history = getattr(source, "history", None)
    if days <= 0 or history is None:
        return None
    with _lock:
        key = (id(book.store), cloud)
        if key in _done and not force:
            return None
        _done.add(key)
    since = datetime.now(UTC) - timedelta(days=days)
    try:
        quotes = history(since)
        rows = book.backfill(cloud, quotes)
    except Exception as exc:  # a bonus: the prices of the poll stand
        first = str(exc).strip().splitlines()[0][:160] if str(exc).strip() else ""
        return f"{cloud}: price history unavailable ({type(exc).__name__}{': ' + first if first else ''})"
    return f"{cloud}: backfilled {rows} past quotes of {days:g} days"
