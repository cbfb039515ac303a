"""Polling the clouds' prices into the price book: all clouds at once, each cloud's regions at once.

A cloud that cannot be asked (no credentials, SDK missing) is skipped with one line; a cloud whose
poll fails keeps its last quotes, marked stale, while the others update.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Literal

from broker.config.settings import Settings
from broker.market.book import PriceBook
from providers.base import CloudUnavailable, PriceSource

POLLED_CLOUDS: tuple[str, ...] = ("aws", "gcp", "azure")

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


def price_sources(settings: Settings, clouds: Sequence[str] = POLLED_CLOUDS) -> dict[str, PriceSource]:
    """One poller per cloud, configured from settings (endpoints, regions, retries)."""
    from providers.fetching import Backoff

    backoff = Backoff(attempts=settings.price_retry_attempts, base_seconds=settings.price_retry_base_seconds)
    sources: dict[str, PriceSource] = {}
    for cloud in clouds:
        if cloud == "aws":
            from providers import aws

            sources[cloud] = aws.AwsPriceSource(
                regions=settings.aws_regions or aws.DEFAULT_REGIONS, ec2_endpoint=settings.aws_endpoint_url_ec2,
                pricing_endpoint=settings.aws_endpoint_url_pricing, backoff=backoff,
                placement_scores=settings.aws_placement_scores)
        elif cloud == "gcp":
            from providers import gcp

            sources[cloud] = gcp.GcpPriceSource(
                project=settings.gcp_project, regions=settings.gcp_regions,
                compute_endpoint=settings.gcp_compute_endpoint, billing_endpoint=settings.gcp_billing_endpoint,
                api_key=settings.gcp_api_key, backoff=backoff)
        elif cloud == "azure":
            from providers import azure

            sources[cloud] = azure.AzurePriceSource(
                regions=settings.azure_regions or azure.DEFAULT_REGIONS, prices_url=settings.azure_prices_url,
                rm_endpoint=settings.azure_rm_endpoint,
                subscription_id=settings.azure_subscription_id or os.environ.get("AZURE_SUBSCRIPTION_ID"),
                backoff=backoff)
        else:
            raise ValueError(f"unknown cloud {cloud!r}; expected one of {', '.join(POLLED_CLOUDS)}")
    return sources


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
    return CloudPoll(cloud, "ok", quotes=len(quotes), seconds=time.monotonic() - started, notes=_notes(source))


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
