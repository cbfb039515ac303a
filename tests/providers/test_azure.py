from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest

from providers.azure import AzurePriceSource, retail_prices
from providers.base import SpotQuote
from providers.fetching import HttpStatusError
from tests.fakeclouds.azure import FakeAzure, resource_sku, retail_item
from tests.fakeclouds.server import FakeServer
from tests.providers.conftest import FAST

ND = "Standard_ND96asr_v4"
NC = "Standard_NC24ads_A100_v4"


def _items() -> list[dict[str, Any]]:
    older = retail_item(ND, "eastus", 28.0)
    older["effectiveStartDate"] = "2023-01-01T00:00:00Z"
    return [
        retail_item(ND, "eastus", 27.197),
        older,  # superseded rate of the same meter
        retail_item(ND, "eastus", 10.8788, variant="Spot"),
        retail_item(ND, "eastus", 5.4394, variant="Low Priority"),
        retail_item(ND, "eastus", 31.613, windows=True),
        retail_item(ND, "eastus", 15.29, variant="Spot", windows=True),
        retail_item(ND, "eastus", 6.2, windows=True, variant="Low Priority"),
        retail_item(ND, "eastus", 16.9, kind="Reservation"),
        retail_item(NC, "eastus", 3.673, series="NCads A100 v4"),
        retail_item(NC, "eastus", 0.7346, variant="Spot", series="NCads A100 v4"),
        retail_item(NC, "westus2", 3.673, series="NCads A100 v4"),
        retail_item(NC, "westus2", 0.81, variant="Spot", series="NCads A100 v4"),
    ]


def _resource_skus() -> list[dict[str, Any]]:
    return [
        resource_sku(ND, "eastus", 8, ["1", "2", "3"], restricted_zones=["3"]),
        resource_sku(NC, "eastus", 1, ["1", "2"]),
        resource_sku(NC, "westus2", 1, ["1", "2", "3"], location_restricted=True),
    ]


class StaticToken:
    """A token credential that needs no identity service: the test stands in for Entra ID."""

    def get_token(self, *scopes: str, **kwargs: Any) -> Any:
        from azure.core.credentials import AccessToken

        return AccessToken("test-token", int(time.time()) + 3600)


@pytest.fixture
def azure() -> Iterator[FakeServer]:
    with FakeServer(FakeAzure(_items(), _resource_skus(), page_size=2)) as server:
        yield server


def _source(server: FakeServer, **kwargs: Any) -> AzurePriceSource:
    return AzurePriceSource(regions=["eastus", "westus2"], prices_url=f"{server.url}/api/retail/prices",
                            backoff=FAST, **kwargs)


def _by_offer(quotes: list[SpotQuote]) -> dict[tuple[str, str], SpotQuote]:
    return {(q.instance_type, q.zone): q for q in quotes}


def test_nd96asr_v4_spot_and_on_demand_without_credentials(azure: FakeServer) -> None:
    source = _source(azure)
    quotes = _by_offer(source.fetch_quotes())
    nd = quotes[(ND, "eastus")]  # region-wide: no resource SKUs to name zones
    assert (nd.spot_price, nd.on_demand_price) == (10.8788, 27.197)
    assert (nd.accelerator, nd.gpus_per_node, nd.gpu_memory_gb) == ("A100", 8, 40)
    assert (quotes[(NC, "westus2")].spot_price, quotes[(NC, "westus2")].on_demand_price) == (0.81, 3.673)
    assert len(quotes) == 3
    assert source.notes == ["azure: no subscription set; public list prices, region-wide, zones not checked"]
    # eastus has 10 matching items in pages of 2, westus2 two: NextPageLink followed to the end
    assert azure.requests["retail"] == 5 + 1
    assert azure.requests["resourceSkus"] == 0


def test_credentials_add_zones_and_restrictions(azure: FakeServer) -> None:
    source = _source(azure, subscription_id="00000000-0000-0000-0000-000000000001", rm_endpoint=azure.url,
                     credential=StaticToken())
    quotes = _by_offer(source.fetch_quotes())
    assert sorted(quotes) == [(NC, "eastus-1"), (NC, "eastus-2"), (ND, "eastus-1"), (ND, "eastus-2")]
    assert quotes[(ND, "eastus-2")].spot_price == 10.8788
    assert set(azure.cloud.authorizations) == {"Bearer test-token"}  # type: ignore[attr-defined]
    assert source.notes == []


def test_throttled_and_failing_calls_are_retried(azure: FakeServer) -> None:
    azure.fail("retail", 429, times=2)
    azure.fail("resourceSkus", 500, times=1)
    source = _source(azure, subscription_id="sub", rm_endpoint=azure.url, credential=StaticToken())
    quotes = _by_offer(source.fetch_quotes())
    assert quotes[(ND, "eastus-1")].on_demand_price == 27.197
    assert azure.requests["retail"] == 6 + 2
    assert azure.requests["resourceSkus"] == 2 + 1


def test_a_server_error_that_persists_fails_the_poll(azure: FakeServer) -> None:
    azure.fail("retail", 500, times=None)
    with pytest.raises(HttpStatusError, match="HTTP 500"):
        _source(azure).fetch_quotes(regions=["eastus"])
    assert azure.requests["retail"] == FAST.attempts


def test_retail_prices_keep_linux_consumption_meters_only() -> None:
    prices = retail_prices(_items())
    assert prices[("eastus", ND)].spot == 10.8788
    assert prices[("eastus", ND)].on_demand == 27.197
    assert prices[("eastus", NC)].spot == 0.7346
