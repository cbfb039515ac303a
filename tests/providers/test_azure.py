from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest

from providers import catalog
from providers.azure import FILTER_SIZES, AzurePriceSource, quoted_sizes, retail_filters, retail_prices
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
    # Two filters per region (the GPU sizes and the first CPU-only ones, then the other CPU-only ones):
    # eastus's first has 10 matching items in pages of 2, westus2's two: NextPageLink followed to the end
    assert azure.requests["retail"] == (5 + 1) + (1 + 1)
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
    assert azure.requests["retail"] == 8 + 2
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


H200 = "Standard_ND96isr_H200_v5"
MI300X = "Standard_ND96isr_MI300X_v5"
GB200 = "Standard_ND128isr_NDR_GB200_v6"
D8 = "Standard_D8s_v5"
F4 = "Standard_F4s_v2"


def _new_size_items() -> list[dict[str, Any]]:
    return [
        retail_item(H200, "eastus", 84.80, series="NDisr H200 v5"),
        retail_item(H200, "eastus", 25.44, variant="Spot", series="NDisr H200 v5"),
        retail_item(MI300X, "eastus", 48.0, series="NDisr MI300X v5"),
        retail_item(MI300X, "eastus", 14.4, variant="Spot", series="NDisr MI300X v5"),
        retail_item(GB200, "eastus", 108.0, series="ND GB200 v6"),
        retail_item(D8, "eastus", 0.384, series="Dsv5"),
        retail_item(D8, "eastus", 0.0768, variant="Spot", series="Dsv5"),
        retail_item(D8, "eastus", 0.752, windows=True, series="Dsv5"),
        retail_item(F4, "eastus", 0.169, series="Fsv2"),
        retail_item(F4, "eastus", 0.0338, variant="Spot", series="Fsv2"),
        retail_item(F4, "eastus", 0.0169, variant="Low Priority", series="Fsv2"),
    ]


@pytest.fixture
def azure_new() -> Iterator[FakeServer]:
    skus = [resource_sku(H200, "eastus", 8, ["1", "3"]), resource_sku(D8, "eastus", 0, ["1", "2", "3"],
                                                                      restricted_zones=["2"])]
    with FakeServer(FakeAzure(_new_size_items(), skus, page_size=3)) as server:
        yield server


def test_h200_mi300x_gb200_and_cpu_only_sizes_are_quoted(azure_new: FakeServer) -> None:
    quotes = _by_offer(_source(azure_new).fetch_quotes(regions=["eastus"]))
    h200 = quotes[(H200, "eastus")]
    assert (h200.accelerator, h200.gpus_per_node, h200.gpu_memory_gb) == ("H200", 8, 141)
    assert (h200.spot_price, h200.on_demand_price) == (25.44, 84.80)
    mi = quotes[(MI300X, "eastus")]
    assert (mi.accelerator, mi.gpus_per_node, mi.gpu_memory_gb, mi.spot_price) == ("MI300X", 8, 192, 14.4)
    gb = quotes[(GB200, "eastus")]
    assert (gb.accelerator, gb.gpus_per_node, gb.spot_price, gb.on_demand_price) == ("GB200", 4, None, 108.0)
    d8, f4 = quotes[(D8, "eastus")], quotes[(F4, "eastus")]
    assert (d8.accelerator, d8.gpus_per_node, d8.gpu_memory_gb) == ("", 0, None)
    assert (d8.spot_price, d8.on_demand_price) == (0.0768, 0.384)  # the Windows meter is not Linux's price
    assert (f4.spot_price, f4.on_demand_price) == (0.0338, 0.169)  # nor Low Priority the spot price
    assert sorted(quotes) == sorted([(H200, "eastus"), (MI300X, "eastus"), (GB200, "eastus"), (D8, "eastus"),
                                     (F4, "eastus")])
    # the GPU filter's 5 items in two pages of 3, the second filter's 6 CPU items (Windows, Low Priority too) in two
    assert azure_new.requests["retail"] == 2 + 2


def test_cpu_only_sizes_take_their_zones_from_the_resource_skus(azure_new: FakeServer) -> None:
    source = _source(azure_new, subscription_id="sub", rm_endpoint=azure_new.url, credential=StaticToken())
    quotes = _by_offer(source.fetch_quotes(regions=["eastus"]))
    assert sorted(quotes) == [(D8, "eastus-1"), (D8, "eastus-3"), (H200, "eastus-1"), (H200, "eastus-3")]
    assert quotes[(D8, "eastus-3")].spot_price == 0.0768


def test_gpu_sizes_only_leaves_the_cpu_only_sizes_and_their_filter_out(azure_new: FakeServer) -> None:
    quotes = _source(azure_new, cpu_types=False).fetch_quotes(regions=["eastus"])
    assert {q.instance_type for q in quotes} == {H200, MI300X, GB200}
    # the catalog's Azure GPU sizes fit one filter: its 5 GPU items in two pages of 3, no CPU items asked for
    assert len(catalog.instance_types("azure")) <= FILTER_SIZES
    assert azure_new.requests["retail"] == 2


def test_retail_filters_name_every_quoted_size_once_in_bounded_batches() -> None:
    sizes = [t.name for t in quoted_sizes()]
    assert {H200, MI300X, GB200, D8, F4} <= set(sizes) and len(sizes) == len(set(sizes))
    filters = retail_filters("eastus", sizes)
    named = [name for f in filters for name in f.split("armSkuName eq '")[1:]]
    assert [n.split("'")[0] for n in named] == sizes
    assert all(f.count("armSkuName eq") <= FILTER_SIZES and len(f) < 2000 for f in filters)
    assert len(filters) == -(-len(sizes) // FILTER_SIZES)


# -- Spot Placement Score ---------------------------------------------------------------------------

PLACEMENT = {("eastus", "1", ND): "High", ("eastus", "2", ND): "Low", ("eastus", "1", NC): "Medium",
             ("eastus", "2", NC): "RestrictedSkuNotAvailable"}


@pytest.fixture
def placed() -> Iterator[FakeServer]:
    with FakeServer(FakeAzure(_items(), _resource_skus(), page_size=50, placement=PLACEMENT)) as server:
        yield server


def _signed_in(server: FakeServer, **kwargs: Any) -> AzurePriceSource:
    return _source(server, subscription_id="sub-1", rm_endpoint=server.url, credential=StaticToken(), **kwargs)


def test_spot_placement_scores_per_zone_and_size(placed: FakeServer) -> None:
    source = _signed_in(placed)
    quotes = _by_offer(source.fetch_quotes())
    assert quotes[(ND, "eastus-1")].placement_level == "High"
    assert quotes[(ND, "eastus-2")].placement_level == "Low"
    assert quotes[(NC, "eastus-1")].placement_level == "Medium"
    assert quotes[(NC, "eastus-2")].placement_level is None  # a "no score" answer: none, and no note
    assert quotes[(ND, "eastus-1")].spot_price == 10.8788
    assert source.notes == []
    [(version, body)] = placed.cloud.placement_requests  # type: ignore[attr-defined]
    assert version == "2025-06-05"
    assert body == {"desiredLocations": ["eastus"], "desiredSizes": [{"sku": NC}, {"sku": ND}], "desiredCount": 1,
                    "availabilityZones": True}
    assert placed.cloud.authorizations[-1] == "Bearer test-token"  # type: ignore[attr-defined]


def test_placement_requests_name_at_most_8_regions_and_5_sizes() -> None:
    from datetime import UTC, datetime

    regions = [f"region{i}" for i in range(10)]
    sizes = [f"Standard_NC{i}ads_A100_v4" for i in range(7)]
    placement = {(region, "1", size): "High" for region in regions for size in sizes}
    offers = [SpotQuote("azure", region, f"{region}-1", size, "A100", 1, 1.0, 2.0, datetime.now(UTC))
              for region in regions for size in sizes]
    with FakeServer(FakeAzure([], [], placement=placement)) as server:
        source = _signed_in(server)
        quotes = source.with_placement_scores(offers)
        bodies = [body for _, body in server.cloud.placement_requests]  # type: ignore[attr-defined]
    assert len(bodies) == 2 * 2  # regions in 8 + 2, sizes in 5 + 2
    assert all(len(b["desiredLocations"]) <= 8 and len(b["desiredSizes"]) <= 5 for b in bodies)
    assert {q.placement_level for q in quotes} == {"High"} and len(quotes) == 70
    assert source.notes == []


def test_placement_scores_cached_throttled_retried_and_refused(placed: FakeServer) -> None:
    source = _signed_in(placed)
    placed.fail("spotPlacementScores", 429, times=1)
    assert _by_offer(source.fetch_quotes())[(ND, "eastus-1")].placement_level == "High"
    assert placed.requests["spotPlacementScores"] == 2
    source.fetch_quotes()
    assert placed.requests["spotPlacementScores"] == 2  # answered from the cache
    placed.fail("spotPlacementScores", 403, times=None, code="AuthorizationFailed")
    fresh = _signed_in(placed)
    quotes = _by_offer(fresh.fetch_quotes())
    assert quotes[(ND, "eastus-1")].placement_level is None and quotes[(ND, "eastus-1")].spot_price == 10.8788
    assert fresh.notes == [f"azure: spot placement score eastus..eastus {NC}..{ND} unavailable (HTTP 403)"]


def test_without_a_subscription_no_placement_score_is_asked(placed: FakeServer) -> None:
    quotes = _source(placed).fetch_quotes()
    assert {q.placement_level for q in quotes} == {None} and placed.requests["spotPlacementScores"] == 0


def _scores(*entries: object) -> bytes:
    import json

    return json.dumps({"placementScores": list(entries)}).encode()


@pytest.mark.parametrize(("body", "level", "note"), [
    (_scores({"sku": ND, "region": "eastus", "availabilityZone": "1", "score": "Excellent"}), None,
     "placementScores[0].score: not High, Medium or Low ('Excellent'); refused"),
    (_scores({"sku": ND, "region": "eastus", "availabilityZone": "1", "score": 9.5}), None,
     "placementScores[0].score: not High, Medium or Low (9.5)"),
    (_scores({"sku": ND, "region": "eastus", "availabilityZone": "1", "score": "x" * 10_000}), None,
     "placementScores[0].score: not High, Medium or Low ('xxxx"),
    (_scores("High", {"sku": ND, "region": "eastus", "availabilityZone": "1", "score": "High"}), "High",
     "placementScores[0]: not an object; skipped"),
    (_scores({"sku": ND + "\x00", "region": "eastus", "availabilityZone": "1", "score": "High"}), None,
     "placementScores[0]: no usable sku or region"),
    (_scores({"sku": ND, "region": "east us/../", "availabilityZone": "1", "score": "High"}), None,
     "no usable sku or region"),
    (_scores({"sku": ND, "region": "eastus", "availabilityZone": "\ud800", "score": "High"}), None,
     "placementScores[0].availabilityZone: not a zone number"),
    (b'{"placementScores": {"sku": 1}}', None, "placementScores: not a list"),
    (b'{"placementScores": [{"score": NaN}]}', None, "unavailable (BodyRefused: answer has a bare NaN)"),
    (b"\x00\x01garbage", None, "unavailable (BodyRefused: answer is not JSON"),
    (b'{"placementScores": ["' + b"y" * 3_000_000 + b'"]}', None, "answer over 2097152 bytes"),
])
def test_hostile_placement_answers_are_refused_per_entry(body: bytes, level: str | None, note: str) -> None:
    fake = FakeAzure(_items(), _resource_skus(), page_size=50)
    fake.placement_body = body
    with FakeServer(fake) as server:
        source = _signed_in(server)
        quotes = _by_offer(source.fetch_quotes())
    nd = quotes[(ND, "eastus-1")]
    assert nd.spot_price == 10.8788 and nd.placement_level == level
    assert any(note in line and line.startswith("azure: spot placement score eastus..eastus ")
               for line in source.notes), source.notes
    assert all(len(line) < 400 for line in source.notes)
