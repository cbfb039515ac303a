"""Each public cloud's price source, built from the settings that name its endpoints and regions.

The settings are any object with the fields of ``PriceSettings`` (the broker's ``Settings``), so
that this module needs nothing from ``broker``.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from typing import Protocol

from providers import aws, azure, gcp
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
    def price_retry_attempts(self) -> int: ...
    @property
    def price_retry_base_seconds(self) -> float: ...


def _aws(settings: PriceSettings, backoff: Backoff) -> PriceSource:
    return aws.AwsPriceSource(
        regions=settings.aws_regions or aws.DEFAULT_REGIONS, ec2_endpoint=settings.aws_endpoint_url_ec2,
        pricing_endpoint=settings.aws_endpoint_url_pricing, backoff=backoff,
        placement_scores=settings.aws_placement_scores)


def _gcp(settings: PriceSettings, backoff: Backoff) -> PriceSource:
    return gcp.GcpPriceSource(
        project=settings.gcp_project, regions=settings.gcp_regions,
        compute_endpoint=settings.gcp_compute_endpoint, billing_endpoint=settings.gcp_billing_endpoint,
        api_key=settings.gcp_api_key, backoff=backoff)


def _azure(settings: PriceSettings, backoff: Backoff) -> PriceSource:
    return azure.AzurePriceSource(
        regions=settings.azure_regions or azure.DEFAULT_REGIONS, prices_url=settings.azure_prices_url,
        rm_endpoint=settings.azure_rm_endpoint,
        subscription_id=settings.azure_subscription_id or os.environ.get("AZURE_SUBSCRIPTION_ID"),
        backoff=backoff)


BUILDERS: dict[str, Callable[[PriceSettings, Backoff], PriceSource]] = {"aws": _aws, "gcp": _gcp, "azure": _azure}


def price_sources(settings: PriceSettings, clouds: Sequence[str] = PUBLIC_CLOUDS) -> dict[str, PriceSource]:
    """One poller per cloud, configured from settings (endpoints, regions, retries)."""
    backoff = Backoff(attempts=settings.price_retry_attempts, base_seconds=settings.price_retry_base_seconds)
    sources: dict[str, PriceSource] = {}
    for cloud in clouds:
        if cloud not in BUILDERS:
            raise ValueError(f"unknown cloud {cloud!r}; expected one of {', '.join(PUBLIC_CLOUDS)}")
        sources[cloud] = BUILDERS[cloud](settings, backoff)
    return sources
