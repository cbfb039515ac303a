"""Polling the clouds' prices into the price book: all clouds at once, each cloud's regions at once.

A cloud that cannot be asked (no credentials, SDK missing) is skipped with one line; a cloud whose
poll fails keeps its last quotes, marked stale, while the others update.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Literal

from broker.config.settings import Settings
from broker.market.backfill import backfill_once
from broker.market.book import PriceBook
from providers.base import CloudUnavailable, PriceSource
from providers.sources import price_sources

# progress(cloud, done, total): a unit (region or listing) of that cloud's poll has finished.
PollProgress = Callable[[str, int, int], None]


@dataclass(frozen=True)
class CloudPoll:
    cloud: str
    status: Literal["ok", "skipped", "failed"]
    quotes: int = 0
    seconds: float = 0.0
    message: str = ""
    notes: list[str] = field(default_factory=list)

    @property
    def line(self) -> str:
        if self.status == "ok":
            return f"{self.cloud}: {self.quotes} quotes in {self.seconds:.1f}s"
        return self.message


def poll_prices(book: PriceBook, sources: Mapping[str, PriceSource], regions: Sequence[str] | None = None,
                progress: PollProgress | None = None) -> list[CloudPoll]:
    """Poll every cloud side by side and record what each brings; one ``CloudPoll`` per cloud."""
    if not sources:
        return []
    with ThreadPoolExecutor(max_workers=len(sources)) as pool:
        futures = {cloud: pool.submit(_poll_one, book, cloud, source, regions, progress)
                   for cloud, source in sources.items()}
        return [futures[cloud].result() for cloud in sources]


def _poll_one(book: PriceBook, cloud: str, source: PriceSource, regions: Sequence[str] | None,
              progress: PollProgress | None) -> CloudPoll:
    started = time.monotonic()
    wanted = list(regions) if regions else None
    scope = wanted or getattr(source, "regions", None)
    try:
        fetch: Any = source.fetch_quotes
        quotes = fetch(wanted, progress=(lambda done, total: progress(cloud, done, total)) if progress else None)
    except CloudUnavailable as exc:
        return CloudPoll(cloud, "skipped", message=str(exc), seconds=time.monotonic() - started)
    except Exception as exc:
        kept = book.mark_stale(cloud, regions=scope)
        return CloudPoll(cloud, "failed", seconds=time.monotonic() - started, notes=_notes(source),
                         message=f"{cloud}: poll failed after retries ({_summary(exc)}); "
                                 f"kept {kept} quotes, marked stale")
    book.record(cloud, quotes, at=datetime.now(UTC), regions=scope)
    # a process's first poll of a cloud that can read its past: that past into the book too
    backfilled = backfill_once(book, cloud, source, float(getattr(source, "backfill_days", 0.0)))
    notes = _notes(source) + ([backfilled] if backfilled else [])
    return CloudPoll(cloud, "ok", quotes=len(quotes), seconds=time.monotonic() - started, notes=notes)


def _notes(source: PriceSource) -> list[str]:
    return list(getattr(source, "notes", []))


def _summary(exc: BaseException) -> str:
    error = getattr(exc, "response", None)
    if isinstance(error, dict) and isinstance(error.get("Error"), dict):  # botocore's ClientError
        text = f"{error['Error'].get('Code', '?')}: {error['Error'].get('Message', '')}"
    else:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        text = f"{type(exc).__name__}: {first}" if first else type(exc).__name__
    return text if len(text) <= 200 else text[:197] + "..."


def refresh_if_old(book: PriceBook, settings: Settings, accelerators: Sequence[str]) -> list[CloudPoll] | None:
    """Poll every cloud first when the newest quote for ``accelerators`` (none: CPU-only offers) is
    older than ``price_max_age_seconds`` (or there is none); None when the book was fresh enough."""
    from broker.market.price_market import quote_age_s

    age = quote_age_s(book, accelerators, datetime.now(UTC))
    if age is not None and age <= settings.price_max_age_seconds:
        return None
    return poll_prices(book, price_sources(settings))
