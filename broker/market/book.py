"""The market the engine reads, and the price book: every quote the pollers bring back, with history, in the store.

A row is a run of unchanged quotes for one offer (cloud, zone, instance type): a poll that sees
the same prices moves the row's ``confirmed_at`` forward, a change starts a new row. From that:
the latest quote per offer, the quote in force at a time, the series of changes in a window, and
a window exported as a market trace (evenly spaced ticks, forward-filled) for ``broker simulate``.

``Market`` is what the engine asks of any market (a replayed trace, the price book): quotes
now, one offer's quote at a time, and, where the market moves in ticks, its ticks and its past;
where it is quoted live and keeps its quotes (the price book), the recent past of some offers.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from sqlalchemy import Select, and_, func, select
from sqlalchemy.orm import Session

from broker.errors import UserError
from broker.market.capacity import capacity_unlikely
from broker.market.rows import quote_row
from broker.store import Store
from broker.store.tables import PriceQuoteRow
from providers.base import OfferKey, SpotQuote
from providers.trace import SIGNAL_COLUMNS, MarketTrace, TraceZone, signal_values, write_trace

if TYPE_CHECKING:
    import numpy as np

Q = TypeVar("Q", bound="Select[*tuple[Any, ...]]")
OfferId = tuple[str, str, str]  # (cloud, zone, instance_type): unique, as zones are per cloud


class Market(Protocol):
    """The market as the engine uses it."""

    def quotes(self, when: datetime) -> list[SpotQuote]:
        """Every offer's quote at ``when``."""
        ...

    def quote(self, key: OfferKey, when: datetime) -> SpotQuote:
        """One offer's quote at ``when`` (for metering and for where a job runs now)."""
        ...

    @property
    def tick_seconds(self) -> float | None:
        """How often the market moves (a replayed trace's tick); None for a market quoted live."""
        ...

    def tick_at(self, when: datetime) -> int:
        """The tick ``when`` falls in (0 for a market quoted live)."""
        ...

    def tick_start(self, when: datetime) -> datetime:
        """The start of the tick ``when`` falls in (``when`` itself for a market quoted live)."""
        ...

    def past(self, accelerator: str, gpus_per_node: int) -> MarketTrace | None:
        """The market's whole history for one kind of node, where it has one (a replayed trace)."""
        ...

    def recent(self, offers: Sequence[OfferKey], now: datetime) -> MarketTrace | None:
        """A market quoted live: the recent past of ``offers``, its last tick ``now`` (None: no past kept)."""
        ...


class LiveQuotes:
    """The tick and history abilities of a market quoted as it is asked (a catalog, a cloud's API):
    no ticks, no past. Such a market supplies ``quotes`` and ``quote`` itself."""

    tick_seconds: float | None = None

    def tick_at(self, when: datetime) -> int:
        return 0

    def tick_start(self, when: datetime) -> datetime:
        return when

    def past(self, accelerator: str, gpus_per_node: int) -> MarketTrace | None:
        return None

    def recent(self, offers: Sequence[OfferKey], now: datetime) -> MarketTrace | None:
        return None


@dataclass(frozen=True, slots=True)
class QuoteFilter:
    """Which offers a query covers; None means any."""

    clouds: tuple[str, ...] | None = None
    accelerator: str | None = None
    min_gpus: int | None = None
    regions: tuple[str, ...] | None = None
    max_gpus: int | None = None  # 0: CPU-only offers
    instance_types: tuple[str, ...] | None = None

    def apply(self, query: Q) -> Q:
        if self.clouds:
            query = query.where(PriceQuoteRow.cloud.in_(self.clouds))
        if self.accelerator:
            query = query.where(func.lower(PriceQuoteRow.accelerator) == self.accelerator.lower())
        if self.min_gpus:
            query = query.where(PriceQuoteRow.gpus_per_node >= self.min_gpus)
        if self.regions:
            query = query.where(PriceQuoteRow.region.in_(self.regions))
        if self.max_gpus is not None:
            query = query.where(PriceQuoteRow.gpus_per_node <= self.max_gpus)
        if self.instance_types:
            query = query.where(PriceQuoteRow.instance_type.in_(self.instance_types))
        return query


ANY = QuoteFilter()


@dataclass(frozen=True, slots=True)
class Recorded:
    inserted: int  # new rows: a new offer or a changed quote
    confirmed: int  # unchanged quotes seen again
    gone: int  # offers the poll no longer lists, now marked stale


@dataclass(frozen=True, slots=True)
class TraceExport:
    path: Path
    rows: int
    zones: int
    ticks: int
    start: datetime
    tick_seconds: float


class NoQuotes(UserError, LookupError):
    """The price book has nothing for the asked window and filter."""


def _offer(q: SpotQuote | PriceQuoteRow) -> OfferId:
    return (q.cloud, q.zone, q.instance_type)


def _same(row: PriceQuoteRow, q: SpotQuote) -> bool:
    return (row.spot_price, row.on_demand_price, row.capacity_score, row.available_nodes, row.accelerator,
            row.gpus_per_node, row.obtainability, row.estimated_uptime_s, row.placement_level, row.preemption_rate) == (
        q.spot_price, q.on_demand_price, q.capacity_score, q.available_nodes, q.accelerator, q.gpus_per_node,
        q.obtainability, q.estimated_uptime_s, q.placement_level, q.preemption_rate)


def _quote(row: PriceQuoteRow, observed_at: datetime | None = None, stale: bool | None = None) -> SpotQuote:
    return SpotQuote(
        cloud=row.cloud, region=row.region, zone=row.zone, instance_type=row.instance_type,
        accelerator=row.accelerator, gpus_per_node=row.gpus_per_node, gpu_memory_gb=row.gpu_memory_gb,
        spot_price=row.spot_price, on_demand_price=row.on_demand_price, capacity_score=row.capacity_score,
        obtainability=row.obtainability, estimated_uptime_s=row.estimated_uptime_s,
        placement_level=row.placement_level, preemption_rate=row.preemption_rate,
        available_nodes=row.available_nodes, observed_at=observed_at or row.confirmed_at,
        stale=row.stale if stale is None else stale,
    )


class PriceBook:
    def __init__(self, store: Store) -> None:
        self.store = store

    # -- writing -----------------------------------------------------------------------------------

    def record(self, cloud: str, quotes: Sequence[SpotQuote], at: datetime | None = None,
               regions: Collection[str] | None = None) -> Recorded:
        """Store one successful poll of ``cloud``. Offers in the polled ``regions`` (None: all) that
        the poll no longer lists are marked stale: the cloud stopped quoting them."""
        at = at or datetime.now(UTC)
        wrong = [q for q in quotes if q.cloud != cloud]
        if wrong:
            raise ValueError(f"record({cloud!r}): got a quote for cloud {wrong[0].cloud!r}")
        inserted = confirmed = gone = 0
        with self.store.transaction() as s:
            latest = self._latest_rows(s, QuoteFilter(clouds=(cloud,)))
            seen: set[OfferId] = set()
            for q in quotes:
                key = _offer(q)
                if key in seen:
                    continue
                seen.add(key)
                row = latest.get(key)
                if row is not None and not row.stale and _same(row, q) and row.confirmed_at <= at:
                    row.confirmed_at = at
                    row.region, row.gpu_memory_gb = q.region, q.gpu_memory_gb
                    confirmed += 1
                    continue
                s.add(quote_row(q, at, at))
                inserted += 1
            for key, row in latest.items():
                if key not in seen and not row.stale and (regions is None or row.region in regions):
                    row.stale = True
                    gone += 1
        return Recorded(inserted, confirmed, gone)

    def backfill(self, cloud: str, quotes: Sequence[SpotQuote]) -> int:
        """Store past quotes from ``cloud``'s own history before the book's first quote of each offer
        (``market/backfill.py``); returns the rows inserted."""
        from broker.market.backfill import insert_history

        with self.store.transaction() as s:
            return insert_history(s, cloud, quotes)

    def mark_stale(self, cloud: str, regions: Collection[str] | None = None) -> int:
        """A poll of ``cloud`` failed: its latest quotes stay, marked stale. Returns how many are kept."""
        with self.store.transaction() as s:
            kept = 0
            for row in self._latest_rows(s, QuoteFilter(clouds=(cloud,))).values():
                if regions is None or row.region in regions:
                    row.stale = True
                    kept += 1
            return kept

    # -- reading -----------------------------------------------------------------------------------

    def latest(self, where: QuoteFilter = ANY) -> list[SpotQuote]:
        """The newest quote of every offer; ``observed_at`` is when the cloud last confirmed it."""
        with self.store.transaction() as s:
            return [_quote(row) for row in self._latest_rows(s, where).values()]

    def accelerators(self) -> list[str]:
        """Every accelerator name the book has a quote for."""
        with self.store.transaction() as s:
            return sorted(s.scalars(select(PriceQuoteRow.accelerator).distinct()))

    def at(self, when: datetime, where: QuoteFilter = ANY) -> list[SpotQuote]:
        """The quote of every offer in force at ``when`` (offers first seen later are left out)."""
        with self.store.transaction() as s:
            return [_quote(row, observed_at=min(row.confirmed_at, when), stale=row.stale and when > row.confirmed_at)
                    for row in self._latest_rows(s, where, until=when).values()]

    def quote_at(self, key: OfferKey, when: datetime) -> SpotQuote | None:
        """One offer's quote in force at ``when`` (None when the book had not quoted it by then)."""
        with self.store.transaction() as s:
            row = s.scalars(select(PriceQuoteRow).where(
                PriceQuoteRow.cloud == key.cloud, PriceQuoteRow.zone == key.zone,
                PriceQuoteRow.instance_type == key.instance_type, PriceQuoteRow.observed_at <= when,
            ).order_by(PriceQuoteRow.observed_at.desc(), PriceQuoteRow.id.desc()).limit(1)).first()
            return None if row is None else _quote(row, observed_at=min(row.confirmed_at, when),
                                                   stale=row.stale and when > row.confirmed_at)

    def newest(self, where: QuoteFilter = ANY) -> datetime | None:
        """When the book last heard from a cloud about offers matching ``where`` (None: never)."""
        with self.store.transaction() as s:
            found = s.scalar(where.apply(select(func.max(PriceQuoteRow.confirmed_at))))
        return None if found is None else (found if found.tzinfo else found.replace(tzinfo=UTC))

    def series(self, key: OfferKey, since: datetime, until: datetime | None = None) -> list[SpotQuote]:
        """Every change of one offer's quote in ``[since, until]``, led by the one in force at ``since``;
        each quote's ``observed_at`` is when it took effect."""
        until = until or datetime.now(UTC)
        where = QuoteFilter(clouds=(key.cloud,))
        with self.store.transaction() as s:
            rows = self._window_rows(s, where, since, until, offer=(key.cloud, key.zone, key.instance_type))
            return [_quote(row, observed_at=row.observed_at, stale=False) for row in rows]

    def export_trace(self, path: str | Path, since: datetime, until: datetime | None = None,
                     tick_seconds: float = 300.0, where: QuoteFilter = ANY,
                     nodes_when_offered: int = 1) -> TraceExport:
        """Write ``[since, until]`` as a market trace: one row per (tick, zone), every zone on the
        same evenly spaced ticks, each tick carrying the quote in force then (forward fill).

        A zone not yet seen at a tick, a stale quote past its last confirmation, a missing spot
        price or a capacity signal below ``LIKELY_SCORE`` (``broker.market.capacity``) count as no spot capacity (0
        nodes); otherwise ``available_nodes`` is the quote's own figure or ``nodes_when_offered``.
        """
        if tick_seconds <= 0:
            raise ValueError("tick_seconds must be positive")
        until = until or datetime.now(UTC)
        with self.store.transaction() as s:
            rows = self._window_rows(s, where, since, until)
        offers = _replayable(rows)
        if not offers:
            raise NoQuotes(f"no quotes with an on-demand price between {since:%Y-%m-%d %H:%M} and "
                           f"{until:%Y-%m-%d %H:%M} UTC")
        first_seen = min(r[0].observed_at for r in offers.values())
        last_seen = max(max(r.confirmed_at for r in v) for v in offers.values())
        start = max(since, first_seen)
        end = min(until, last_seen)
        ticks = int((end - start).total_seconds() // tick_seconds) + 1 if end >= start else 1
        trace = _as_trace(offers, start, tick_seconds, ticks, nodes_when_offered)
        written = write_trace(path, (q for t in range(trace.num_ticks) for q in trace.quotes_at(t)), signals=True)
        return TraceExport(Path(path), written, len(offers), ticks, start, tick_seconds)

    def recent(self, offers: Collection[OfferId], until: datetime, tick_seconds: float, max_ticks: int,
               nodes_when_offered: int, fresh_for_s: float | None = None) -> MarketTrace | None:
        """The recent past of ``offers`` as a trace whose last tick is ``until``: at most ``max_ticks``
        ticks, none before the first quote of any of them (None: none was ever quoted). Past a
        quote's last confirmation by ``fresh_for_s`` its zone has no spot capacity, as past a stale one."""
        wanted = set(offers)
        if not wanted or max_ticks < 1:
            return None
        since = until - timedelta(seconds=tick_seconds * (max_ticks - 1))
        where = QuoteFilter(clouds=tuple(sorted({cloud for cloud, _, _ in wanted})),
                            instance_types=tuple(sorted({kind for _, _, kind in wanted})))
        with self.store.transaction() as s:
            rows = [r for r in self._window_rows(s, where, since, until) if _offer(r) in wanted]
        found = _replayable(rows)
        if not found:
            return None
        first_seen = max(since, min(r[0].observed_at for r in found.values()))
        ticks = int((until - first_seen).total_seconds() // tick_seconds) + 1
        start = until - timedelta(seconds=tick_seconds * (ticks - 1))
        return _as_trace(found, start, tick_seconds, ticks, nodes_when_offered, fresh_for_s)

    # -- queries -----------------------------------------------------------------------------------

    @staticmethod
    def _latest_rows(s: Session, where: QuoteFilter, until: datetime | None = None) -> dict[OfferId, PriceQuoteRow]:
        newest = select(PriceQuoteRow.cloud, PriceQuoteRow.zone, PriceQuoteRow.instance_type,
                        func.max(PriceQuoteRow.observed_at).label("observed_at"))
        newest = where.apply(newest)
        if until is not None:
            newest = newest.where(PriceQuoteRow.observed_at <= until)
        sub = newest.group_by(PriceQuoteRow.cloud, PriceQuoteRow.zone, PriceQuoteRow.instance_type).subquery()
        query = select(PriceQuoteRow).join(sub, and_(
            PriceQuoteRow.cloud == sub.c.cloud, PriceQuoteRow.zone == sub.c.zone,
            PriceQuoteRow.instance_type == sub.c.instance_type, PriceQuoteRow.observed_at == sub.c.observed_at,
        )).order_by(PriceQuoteRow.id)
        return {_offer(row): row for row in s.scalars(query)}  # ties: the last inserted wins

    @classmethod
    def _window_rows(cls, s: Session, where: QuoteFilter, since: datetime, until: datetime,
                     offer: OfferId | None = None) -> list[PriceQuoteRow]:
        """Rows that took effect in ``[since, until]`` plus the row of each offer in force at ``since``,
        ordered by offer then time."""
        query = where.apply(select(PriceQuoteRow)).where(
            PriceQuoteRow.observed_at >= since, PriceQuoteRow.observed_at <= until)
        if offer is not None:
            query = query.where(PriceQuoteRow.zone == offer[1], PriceQuoteRow.instance_type == offer[2])
        rows = list(s.scalars(query))
        before = cls._latest_rows(s, where, until=since)
        if offer is not None:
            before = {k: v for k, v in before.items() if k == offer}
        ids = {r.id for r in rows}
        rows.extend(r for r in before.values() if r.id not in ids)
        rows.sort(key=lambda r: (r.cloud, r.zone, r.instance_type, r.observed_at, r.id))
        return rows


def _replayable(rows: list[PriceQuoteRow]) -> dict[OfferId, list[PriceQuoteRow]]:
    """Rows by offer, in time order; an offer never quoted on-demand cannot be replayed (its fallback is unknown)."""
    by_offer: dict[OfferId, list[PriceQuoteRow]] = {}
    for row in rows:
        by_offer.setdefault(_offer(row), []).append(row)
    return {k: v for k, v in by_offer.items() if any(r.on_demand_price is not None for r in v)}


def _as_trace(offers: dict[OfferId, list[PriceQuoteRow]], start: datetime, tick_seconds: float, ticks: int,
              nodes_when_offered: int, fresh_for_s: float | None = None) -> MarketTrace:
    import numpy as np

    tick_epochs = np.array([(start + timedelta(seconds=tick_seconds * i)).timestamp() for i in range(ticks)])
    columns = [_column(rows, tick_epochs, nodes_when_offered, fresh_for_s) for rows in offers.values()]
    zones = tuple(TraceZone(OfferKey(rows[-1].cloud, rows[-1].region, rows[-1].zone, rows[-1].instance_type),
                            rows[-1].accelerator, rows[-1].gpus_per_node) for rows in offers.values())
    spot, on_demand, nodes, signals = (np.stack([c[i] for c in columns], axis=1) for i in range(4))
    return MarketTrace(start, tick_seconds, zones, spot, on_demand, nodes.astype(np.int64),
                       {name: signals[:, :, k] for k, name in enumerate(SIGNAL_COLUMNS)})


def _column(rows: list[PriceQuoteRow], ticks: np.ndarray, nodes_when_offered: int,
            fresh_for_s: float | None) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Spot price, on-demand price, spot nodes and [tick, signal] capacity signals of one offer at every tick."""
    import numpy as np

    first_on_demand = next(r.on_demand_price for r in rows if r.on_demand_price is not None)
    spot, on_demand, nodes, confirmed = [], [], [], []
    last_on_demand = first_on_demand
    for r in rows:
        last_on_demand = r.on_demand_price if r.on_demand_price is not None else last_on_demand
        on_demand.append(last_on_demand)
        spot.append(r.spot_price if r.spot_price is not None else last_on_demand)
        offered = r.spot_price is not None and not capacity_unlikely(r)
        nodes.append(r.available_nodes if r.available_nodes is not None else
                     (nodes_when_offered if offered else 0))
        held = r.confirmed_at.timestamp() + (fresh_for_s if fresh_for_s is not None else np.inf)
        confirmed.append(r.confirmed_at.timestamp() if r.stale else held)
    starts = np.array([r.observed_at.timestamp() for r in rows])
    index = np.searchsorted(starts, ticks, side="right") - 1
    seen = index >= 0
    index = np.maximum(index, 0)
    spot_at, on_demand_at = np.array(spot)[index], np.array(on_demand)[index]
    nodes_at = np.where(seen & (ticks <= np.array(confirmed)[index]), np.array(nodes)[index], 0)
    signals_at = np.where(seen[:, None], np.array([signal_values(r) for r in rows])[index], np.nan)
    return spot_at, on_demand_at, nodes_at, signals_at

