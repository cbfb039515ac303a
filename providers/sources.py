"""Each public cloud's price source, built from the settings that name its endpoints and regions.

The settings are any object with the fields of ``PriceSettings`` (the broker's ``Settings``), so
that this module needs nothing from ``broker``.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Sequence
from typing import Protocol

from providers import aws, azure, capacity, gcp, gcp_history
from providers.base import PUBLIC_CLOUDS, PriceSource
from providers.fetching import Backoff


class PriceSettings(Protocol):
    """What the price sources read from the settings."""

    @property
    def aws_regions(self) -> list[str] | None: ...
    @property
    def aws_endpoint_url_ec2(self) -> str | None: ...
    @property
    def aws_endpoint_url_pricing(self) -> str | None: ...
    @property
    def aws_placement_scores(self) -> bool: ...
    @property
    def gcp_project(self) -> str | None: ...
    @property
    def gcp_regions(self) -> list[str] | None: ...
    @property
    def gcp_compute_endpoint(self) -> str | None: ...
    @property
    def gcp_billing_endpoint(self) -> str | None: ...
    @property
    def gcp_api_key(self) -> str | None: ...
    @property
    def azure_regions(self) -> list[str] | None: ...
    @property
    def azure_prices_url(self) -> str: ...
    @property
    def azure_rm_endpoint(self) -> str | None: ...
    @property
    def azure_subscription_id(self) -> str | None: ...
    @property
    def gcp_capacity_advice(self) -> bool: ...
    @property
    def gcp_capacity_history(self) -> bool: ...
    @property
    def price_backfill_days(self) -> float: ...
    @property
    def azure_placement_scores(self) -> bool: ...
    @property
    def capacity_request_interval_seconds(self) -> float: ...
    @property
    def capacity_cache_seconds(self) -> float: ...
    @property
    def price_retry_attempts(self) -> int: ...
    @property
    def price_retry_base_seconds(self) -> float: ...


_capacity_states: dict[tuple[str, float, float], tuple[capacity.Throttle, capacity.TtlCache]] = {}
_capacity_lock = threading.Lock()
# advice.capacityHistory changes once a day: one cache of it per process, for hours
_history_cache = capacity.TtlCache(gcp_history.CACHE_S)


def capacity_state(cloud: str, settings: PriceSettings) -> tuple[capacity.Throttle, capacity.TtlCache]:
    """One throttle and answer cache per cloud for the whole process: the service builds its pollers
    anew for each refresh, and the quota and the cached answers outlive each one."""
    key = (cloud, settings.capacity_request_interval_seconds, settings.capacity_cache_seconds)
    with _capacity_lock:
        if key not in _capacity_states:
            _capacity_states[key] = (capacity.Throttle(key[1]), capacity.TtlCache(key[2]))
        return _capacity_states[key]


def _aws(settings: PriceSettings, backoff: Backoff) -> PriceSource:
    return aws.AwsPriceSource(
        regions=settings.aws_regions or aws.DEFAULT_REGIONS, ec2_endpoint=settings.aws_endpoint_url_ec2,
        pricing_endpoint=settings.aws_endpoint_url_pricing, backoff=backoff,
        placement_scores=settings.aws_placement_scores)


def _gcp(settings: PriceSettings, backoff: Backoff) -> PriceSource:
    return gcp.GcpPriceSource(
        project=settings.gcp_project, regions=settings.gcp_regions,
        compute_endpoint=settings.gcp_compute_endpoint, billing_endpoint=settings.gcp_billing_endpoint,
        api_key=settings.gcp_api_key, backoff=backoff, capacity_advice=settings.gcp_capacity_advice,
        advice_state=capacity_state("gcp", settings), capacity_history=settings.gcp_capacity_history,
        history_cache=_history_cache)


def _azure(settings: PriceSettings, backoff: Backoff) -> PriceSource:
    return azure.AzurePriceSource(
        regions=settings.azure_regions or azure.DEFAULT_REGIONS, prices_url=settings.azure_prices_url,
        rm_endpoint=settings.azure_rm_endpoint,
        subscription_id=settings.azure_subscription_id or os.environ.get("AZURE_SUBSCRIPTION_ID"),
        backoff=backoff, placement_scores=settings.azure_placement_scores,
        placement_state=capacity_state("azure", settings))


BUILDERS: dict[str, Callable[[PriceSettings, Backoff], PriceSource]] = {"aws": _aws, "gcp": _gcp, "azure": _azure}


def price_sources(settings: PriceSettings, clouds: Sequence[str] = PUBLIC_CLOUDS) -> dict[str, PriceSource]:
    """One poller per cloud, configured from settings (endpoints, regions, retries)."""
    backoff = Backoff(attempts=settings.price_retry_attempts, base_seconds=settings.price_retry_base_seconds)
    sources: dict[str, PriceSource] = {}
    for cloud in clouds:
        if cloud not in BUILDERS:
            raise ValueError(f"unknown cloud {cloud!r}; expected one of {', '.join(PUBLIC_CLOUDS)}")
        source = sources[cloud] = BUILDERS[cloud](settings, backoff)
        if isinstance(source, (aws.AwsPriceSource, gcp.GcpPriceSource)):
            source.backfill_days = settings.price_backfill_days
    return sources
