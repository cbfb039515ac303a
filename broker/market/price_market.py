"""The price book as the engine's market on the SkyPilot backend, embedded or served.

Every decision reads the offers the pollers last brought back (``PriceBook.latest``): per zone the
spot and on-demand price now, the cloud's capacity signal (AWS placement score, GCP obtainability,
Azure placement level: ``broker.market.capacity``), and whether the quote is stale. A quote is seen
with no spot capacity when its capacity signal says a launch is unlikely (below ``LIKELY_SCORE``
on the common scale), or when it is stale: the cloud stopped listing it, its last poll failed, or
nobody confirmed it for ``stale_after_s``. On-demand stays offered. The broker's own record of
preemptions and failed launches per zone comes from the store, with the request (``zone_records``),
and so does the recent past of the offers asked about (``recent``: the request's ``history``).

SkyPilot's catalog is only the fallback for offers the price book has never quoted: those of an
accelerator no poll has brought back (regions the pollers skip are not filled in from the catalog's
static prices); such an offer's ``source`` says so. The ledger books each minute at the quote in
force for that offer then (``PriceBook.quote_at``): spot prices that move while a job runs are
billed as they moved.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from typing import Protocol

from broker.market.book import LiveQuotes, PriceBook, QuoteFilter
from broker.market.capacity import capacity_unlikely
from providers.base import OfferKey, SpotQuote
from providers.trace import MarketTrace

log = logging.getLogger("broker.market.price_market")

PRICE_BOOK = "price-book"
# The recent past a decision sees: a day of five-minute ticks (the engine reviews a running job's
# place every five minutes on a live market), at most this many ticks x offers in all.
HISTORY_WINDOW = timedelta(hours=24)
HISTORY_TICK_S = 300.0
HISTORY_CELLS = 200_000
HISTORY_REUSE = timedelta(seconds=60)
# Spot nodes a zone is counted to have when the cloud gives no count (a chance, as in ``spot_ok``).
UNKNOWN_NODES = 1_000_000
CATALOG = "skypilot-catalog"


@dataclass(frozen=True, slots=True)
class SourcedQuote:
    """A quote as the engine sees it, where it came from, and how old it is."""

    quote: SpotQuote
    source: str  # PRICE_BOOK or CATALOG
    age_s: float | None  # None: a catalog price, which has no time


class Catalog(Protocol):
    """The fallback: a catalog that quotes the offers of named accelerators (``SkyCatalogMarket``)."""

    def quotes_for(self, names: Iterable[str], when: datetime) -> list[SpotQuote]: ...

    def quote(self, key: OfferKey, when: datetime) -> SpotQuote: ...


class PriceBookMarket(LiveQuotes):
    """``wanted`` names the accelerators decisions are asked for now (those of the active jobs); the
    catalog is read only for those the book has never quoted, and not again for ``retry_s`` after
    it could not be read (offline, each read would stall the engine on SkyPilot's retries).

    A decision also sees the recent past of the offers it is asked about (``recent``): the book's
    quotes at ``history_tick_s`` ticks ending now, over at most ``history_window``, and never more
    than ``history_cells`` ticks x offers (older ticks are dropped first)."""

    def __init__(self, book: PriceBook, fallback: Catalog | None = None, stale_after_s: float = 3600.0,
                 wanted: Callable[[], Iterable[str]] = lambda: (), retry_s: float = 600.0,
                 history_window: timedelta = HISTORY_WINDOW, history_tick_s: float = HISTORY_TICK_S,
                 history_cells: int = HISTORY_CELLS) -> None:
        self.book = book
        self.fallback = fallback
        self.stale_after_s = stale_after_s
        self.wanted = wanted
        self.retry_s = retry_s
        self.history_window = history_window
        self.history_tick_s = history_tick_s
        self.history_cells = history_cells
        self._failed_at: float | None = None
        # The last recent past built per set of offers: a pending job is planned every step, and
        # the book moves only when polled, so a past is reused for HISTORY_REUSE_S of clock time.
        self._recent: dict[frozenset[tuple[str, str, str]], tuple[datetime, MarketTrace | None]] = {}

    def offers(self, when: datetime) -> list[SourcedQuote]:
        """Every offer at ``when``: the price book's, then the catalog's for accelerators it never quoted."""
        quoted = self.book.latest()
        seen = {q.accelerator.lower() for q in quoted}
        out = [SourcedQuote(self._as_seen(q, when), PRICE_BOOK, max(0.0, (when - q.observed_at).total_seconds()))
               for q in quoted]
        missing = {a.lower() for a in self.wanted()} - seen
        out += [SourcedQuote(q, CATALOG, None) for q in self._fallback_quotes(missing, when)]
        return out

    def _as_seen(self, q: SpotQuote, when: datetime) -> SpotQuote:
        stale = q.stale or (when - q.observed_at).total_seconds() > self.stale_after_s
        unlikely = capacity_unlikely(q)
        if stale or unlikely:
            return replace(q, available_nodes=0, stale=stale)
        return q

    def _fallback_quotes(self, names: set[str], when: datetime) -> list[SpotQuote]:
        if self.fallback is None or not names:
            return []
        if self._failed_at is not None and time.monotonic() - self._failed_at < self.retry_s:
            return []
        try:
            quotes = self.fallback.quotes_for(names, when)
        except Exception as exc:  # an unreachable catalog leaves the price book's offers
            log.warning("SkyPilot's catalog cannot be read (%s); deciding on the price book alone for %d s",
                        type(exc).__name__, int(self.retry_s))
            self._failed_at = time.monotonic()
            return []
        self._failed_at = None
        return quotes

    def quotes(self, when: datetime) -> list[SpotQuote]:
        return [o.quote for o in self.offers(when)]

    def quote(self, key: OfferKey, when: datetime) -> SpotQuote:
        found = self.book.quote_at(key, when)
        if found is not None:
            return found
        if self.fallback is not None:
            try:
                return self.fallback.quote(key, when)
            except Exception as exc:
                log.debug("catalog quote for %s: %s", key, exc)
        return SpotQuote(key.cloud, key.region, key.zone, key.instance_type, "", 0, None, None, when)

    def recent(self, offers: Sequence[OfferKey], now: datetime) -> MarketTrace | None:
        """The book's recent past of ``offers``, as the policy reads a replayed trace's: spot and
        on-demand prices per tick, and spot capacity (none where the quote was stale or its
        placement score low, unknown counted as ``UNKNOWN_NODES``), its last tick the quotes now."""
        ids = frozenset((k.cloud, k.zone, k.instance_type) for k in offers)
        if not ids:
            return None
        built = self._recent.get(ids)
        if built is not None and timedelta(0) <= now - built[0] < HISTORY_REUSE:
            return built[1]
        ticks = min(int(self.history_window.total_seconds() // self.history_tick_s) + 1,
                    self.history_cells // len(ids))
        past = self.book.recent(ids, now, self.history_tick_s, ticks, UNKNOWN_NODES, self.stale_after_s)
        if len(self._recent) >= 64:
            self._recent.clear()
        self._recent[ids] = (now, past)
        return past

    def history(self, key: OfferKey, now: datetime, window: timedelta = timedelta(hours=24)) -> list[SpotQuote]:
        """The offer's quote changes over ``window`` before ``now``, led by the one in force at its start."""
        return self.book.series(key, now - window, now)


def quote_age_s(book: PriceBook, accelerators: Iterable[str], now: datetime) -> float | None:
    """Seconds since the newest quote for any of ``accelerators``, or for none (a CPU task's
    ``[]``) since the newest CPU-only quote (None: never quoted)."""
    filters = [QuoteFilter(accelerator=a) for a in accelerators] or [QuoteFilter(max_gpus=0)]
    newest = [t for t in (book.newest(f) for f in filters) if t is not None]
    return None if not newest else max(0.0, (now - max(newest)).total_seconds())
