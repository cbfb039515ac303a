from __future__ import annotations

from collections.abc import Iterator

import pytest
from google.api_core.exceptions import InternalServerError
from google.auth.credentials import AnonymousCredentials

from providers.base import CloudUnavailable, SpotQuote
from providers.gcp import GcpPriceSource, index_skus, machine_type_filter
from tests.fakeclouds.gcp import FakeGcp, accelerator_type, machine_type, sku
from tests.fakeclouds.server import FakeServer
from tests.providers.conftest import FAST

US = ["us-central1"]
# a3-highgpu-8g: 8 x H100, 208 vCPUs, 1872 GiB
A3_ON_DEMAND = 8 * 9.796 + 208 * 0.0305 + 1872 * 0.00409
A3_SPOT = 8 * 2.25 + 208 * 0.00715 + 1872 * 0.000958
# n1-highmem-8 with one attached V100: 8 vCPUs, 52 GiB
N1_V100_ON_DEMAND = 2.48 + 8 * 0.031611 + 52 * 0.004237
N1_V100_SPOT = 0.992 + 8 * 0.00698 + 52 * 0.000936


def _skus() -> list[dict]:
    return [
        sku("Nvidia H100 80GB GPU running in Americas", "GPU", "OnDemand", US, 9.796),
        sku("Nvidia H100 80GB GPU attached to Spot Preemptible VMs running in Americas", "GPU", "Preemptible", US,
            2.25),
        sku("A3 Instance Core running in Americas", "CPU", "OnDemand", US, 0.0305),
        sku("A3 Instance Ram running in Americas", "RAM", "OnDemand", US, 0.00409, unit="GiBy.h"),
        sku("Spot Preemptible A3 Instance Core running in Americas", "CPU", "Preemptible", US, 0.00715),
        sku("Spot Preemptible A3 Instance Ram running in Americas", "RAM", "Preemptible", US, 0.000958,
            unit="GiBy.h"),
        # the same resources bought other ways, or other resources with similar names: never picked
        sku("Commitment v1: Nvidia H100 80GB GPU running in Americas for 1 Year", "GPU", "Commit1Yr", US, 6.1),
        sku("DWS Defined Duration Nvidia H100 80GB GPU running in Americas", "GPU", "OnDemand", US, 5.5),
        sku("Nvidia H100 80GB Mega GPU running in Americas", "GPU", "OnDemand", US, 11.0),
        sku("A3Plus Instance Core running in Americas", "CPU", "OnDemand", US, 0.05),
        sku("Nvidia H100 80GB GPU running in Netherlands", "GPU", "OnDemand", ["europe-west4"], 10.7),
        sku("Nvidia Tesla V100 GPU running in Americas", "GPU", "OnDemand", US, 2.48),
        sku("Spot Preemptible Nvidia Tesla V100 GPU running in Americas", "GPU", "Preemptible", US, 0.992),
        sku("N1 Predefined Instance Core running in Americas", "N1Standard", "OnDemand", US, 0.031611),
        sku("N1 Predefined Instance Ram running in Americas", "N1Standard", "OnDemand", US, 0.004237,
            unit="GiBy.h"),
        sku("Spot Preemptible N1 Predefined Instance Core running in Americas", "N1Standard", "Preemptible", US,
            0.00698),
        sku("Spot Preemptible N1 Predefined Instance Ram running in Americas", "N1Standard", "Preemptible", US,
            0.000936, unit="GiBy.h"),
    ]


def _machine_types() -> list[dict]:
    return [
        machine_type("a3-highgpu-8g", "us-central1-a", 208, 1872 * 1024, "nvidia-h100-80gb", 8),
        machine_type("a3-highgpu-8g", "us-central1-b", 208, 1872 * 1024, "nvidia-h100-80gb", 8),
        machine_type("n1-highmem-8", "us-central1-a", 8, 52 * 1024),
        machine_type("n1-highmem-8", "us-central1-b", 8, 52 * 1024),
        machine_type("e2-standard-8", "us-central1-a", 8, 32 * 1024),  # not a GPU type: filtered out
        machine_type("a3-highgpu-8g", "europe-west4-a", 208, 1872 * 1024, "nvidia-h100-80gb", 8),
    ]


def _accelerator_types() -> list[dict]:
    return [
        accelerator_type("nvidia-tesla-v100", "us-central1-a", 8),
        accelerator_type("nvidia-h100-80gb", "us-central1-a", 8),
        accelerator_type("nvidia-h100-80gb", "us-central1-b", 8),
    ]


@pytest.fixture
def gcp() -> Iterator[FakeServer]:
    with FakeServer(FakeGcp(_skus(), _machine_types(), _accelerator_types(), page_size=3)) as server:
        yield server


def _source(server: FakeServer, **kwargs: object) -> GcpPriceSource:
    return GcpPriceSource(project="p", compute_endpoint=server.url, billing_endpoint=server.url,
                          credentials=AnonymousCredentials(), backoff=FAST, **kwargs)  # type: ignore[arg-type]


def _by_offer(quotes: list[SpotQuote]) -> dict[tuple[str, str], SpotQuote]:
    return {(q.instance_type, q.zone): q for q in quotes}


def test_a3_highgpu_8g_price_is_its_gpus_cores_and_ram(gcp: FakeServer) -> None:
    quotes = _by_offer(_source(gcp, api_key="k-123").fetch_quotes())
    a3 = quotes[("a3-highgpu-8g", "us-central1-a")]
    assert a3.spot_price == pytest.approx(A3_SPOT, abs=1e-6)
    assert a3.on_demand_price == pytest.approx(A3_ON_DEMAND, abs=1e-6)
    assert (a3.region, a3.accelerator, a3.gpus_per_node, a3.gpu_memory_gb) == ("us-central1", "H100", 8, 80)
    assert quotes[("a3-highgpu-8g", "us-central1-b")].spot_price == a3.spot_price
    # europe-west4 has a GPU price but no core/RAM SKUs in this catalog: no quote rather than a wrong one
    assert ("a3-highgpu-8g", "europe-west4-a") not in quotes
    # n1 takes its GPU attached, only where the zone has that accelerator
    n1 = quotes[("n1-highmem-8", "us-central1-a")]
    assert (n1.accelerator, n1.gpus_per_node) == ("V100", 1)
    assert n1.spot_price == pytest.approx(N1_V100_SPOT, abs=1e-6)
    assert n1.on_demand_price == pytest.approx(N1_V100_ON_DEMAND, abs=1e-6)
    assert ("n1-highmem-8", "us-central1-b") not in quotes
    assert len(quotes) == 3
    # 17 SKUs in pages of 3, 5 GPU machine types in pages of 3
    assert gcp.requests["skus"] == 6 and gcp.requests["machineTypes"] == 2
    assert set(gcp.cloud.api_keys_seen) == {"k-123"}  # type: ignore[attr-defined]


def test_region_filter(gcp: FakeServer) -> None:
    quotes = _source(gcp).fetch_quotes(regions=["europe-west4"])
    assert quotes == []


def test_throttled_and_failing_listings_are_retried(gcp: FakeServer) -> None:
    gcp.fail("skus", 429, times=2)
    gcp.fail("machineTypes", 500, times=1)
    gcp.fail("acceleratorTypes", 503, times=1)
    quotes = _by_offer(_source(gcp).fetch_quotes())
    assert quotes[("a3-highgpu-8g", "us-central1-a")].spot_price == pytest.approx(A3_SPOT, abs=1e-6)
    assert gcp.requests["skus"] == 6 + 2
    assert gcp.requests["machineTypes"] == 2 + 1
    assert gcp.requests["acceleratorTypes"] == 1 + 1


def test_a_server_error_that_persists_fails_the_poll(gcp: FakeServer) -> None:
    gcp.fail("machineTypes", 500, times=None)
    with pytest.raises(InternalServerError):
        _source(gcp).fetch_quotes()
    assert gcp.requests["machineTypes"] == FAST.attempts


def test_without_credentials_or_endpoint_the_cloud_is_skipped(monkeypatch: pytest.MonkeyPatch,
                                                               tmp_path: object) -> None:
    monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", "")
    monkeypatch.setenv("CLOUDSDK_CONFIG", str(tmp_path))
    monkeypatch.setenv("GCE_METADATA_HOST", "127.0.0.1:9")  # nothing answers there: not on GCE
    monkeypatch.setenv("GCE_METADATA_IP", "127.0.0.1:9")
    monkeypatch.delenv("GOOGLE_CLOUD_PROJECT", raising=False)
    with pytest.raises(CloudUnavailable, match=r"^gcp: no application default credentials .*; skipped$"):
        GcpPriceSource(project="p", backoff=FAST).fetch_quotes()


def test_sku_index_ignores_commitments_dws_and_other_series() -> None:
    prices = index_skus(_skus())
    assert prices.get("OnDemand", "us-central1", "gpu", "nvidia-h100-80gb") == pytest.approx(9.796)
    assert prices.get("OnDemand", "us-central1", "gpu", "nvidia-h100-mega-80gb") == pytest.approx(11.0)
    assert prices.get("OnDemand", "us-central1", "core", "a3") == pytest.approx(0.0305)
    assert prices.get("OnDemand", "us-central1", "core", "a3-megagpu") == pytest.approx(0.05)
    assert prices.get("Preemptible", "us-central1", "ram", "n1") == pytest.approx(0.000936)
    assert prices.get("OnDemand", "europe-west4", "gpu", "nvidia-h100-80gb") == pytest.approx(10.7)


def test_machine_type_filter_is_a_compute_regex_over_gpu_families() -> None:
    import re

    expression = re.fullmatch(r'name eq "(.*)"', machine_type_filter())
    assert expression is not None
    pattern = re.compile(expression.group(1))
    assert pattern.fullmatch("a3-highgpu-8g") and pattern.fullmatch("g2-standard-4")
    assert pattern.fullmatch("n1-highmem-8") and not pattern.fullmatch("e2-standard-8")


def test_h200_b200_and_cpu_only_machines_are_priced_from_their_own_skus() -> None:
    """a3-ultragpu-8g (8 x H200), a4-highgpu-8g (8 x B200) and the catalog's c2-standard-16 (no GPU),
    with the SKU descriptions the billing catalog gives them."""
    skus = [
        sku("H200 141GB GPU running in Americas", "GPU", "OnDemand", US, 10.0),
        sku("H200 141GB GPU attached to Spot Preemptible VMs running in Americas", "GPU", "Preemptible", US, 3.0),
        sku("A4 Nvidia B200 (1 gpu slice) running in Americas", "GPU", "OnDemand", US, 16.11),
        sku("A4 Nvidia B200 (1 gpu slice) attached to Spot Preemptible VMs running in Americas", "GPU",
            "Preemptible", US, 5.0),
        *(sku(f"{prefix}{words} {kind} running in Americas", group, usage, US, price,
              unit="GiBy.h" if kind == "Ram" else "h")
          for words, core, ram in (("A3Ultra Instance", 0.03, 0.004), ("A4 Instance", 0.04, 0.005),
                                   ("Compute optimized", 0.0339, 0.00454))
          for prefix, usage, factor in (("", "OnDemand", 1.0), ("Spot Preemptible ", "Preemptible", 0.3))
          for kind, group, price in (("Core", "CPU", round(core * factor, 6)), ("Ram", "RAM", round(ram * factor, 6)))),
    ]
    machines = [
        machine_type("a3-ultragpu-8g", "us-central1-b", 224, 2952 * 1024, "nvidia-h200-141gb", 8),
        machine_type("a4-highgpu-8g", "us-central1-b", 224, 3968 * 1024, "nvidia-b200", 8),
        machine_type("c2-standard-16", "us-central1-a", 16, 64 * 1024),
        machine_type("c2-standard-8", "us-central1-a", 8, 32 * 1024),  # not in the catalog: not listed
    ]
    assert "c2-standard-16" in machine_type_filter() and "a4-.*" in machine_type_filter()
    assert "c2-standard-16" not in machine_type_filter(cpu_types=False)
    with FakeServer(FakeGcp(skus, machines, [], page_size=50)) as server:
        quotes = _by_offer(_source(server).fetch_quotes())
    h200, b200 = quotes[("a3-ultragpu-8g", "us-central1-b")], quotes[("a4-highgpu-8g", "us-central1-b")]
    assert (h200.accelerator, h200.gpus_per_node, h200.gpu_memory_gb) == ("H200", 8, 141)
    assert h200.on_demand_price == pytest.approx(8 * 10.0 + 224 * 0.03 + 2952 * 0.004, abs=1e-5)
    assert h200.spot_price == pytest.approx(8 * 3.0 + 224 * 0.009 + 2952 * 0.0012, abs=1e-5)
    assert (b200.accelerator, b200.gpus_per_node, b200.gpu_memory_gb) == ("B200", 8, 180)
    assert b200.on_demand_price == pytest.approx(8 * 16.11 + 224 * 0.04 + 3968 * 0.005, abs=1e-5)
    c2 = quotes[("c2-standard-16", "us-central1-a")]
    assert (c2.accelerator, c2.gpus_per_node) == ("", 0)
    assert c2.on_demand_price == pytest.approx(16 * 0.0339 + 64 * 0.00454, abs=1e-5)
    assert c2.spot_price == pytest.approx(16 * 0.01017 + 64 * 0.001362, abs=1e-5)
    assert ("c2-standard-8", "us-central1-a") not in quotes


# -- capacity advice (advice.capacity) -------------------------------------------------------------

ADVICE = {("us-central1-a", "a3-highgpu-8g"): (0.8, "7200s"), ("us-central1-b", "a3-highgpu-8g"): (0.3, "1800.5s")}


@pytest.fixture
def advised() -> Iterator[FakeServer]:
    with FakeServer(FakeGcp(_skus(), _machine_types(), _accelerator_types(), advice=ADVICE)) as server:
        yield server


def test_capacity_advice_scores_each_spot_gpu_offer(advised: FakeServer) -> None:
    source = _source(advised)
    quotes = _by_offer(source.fetch_quotes())
    a, b = quotes[("a3-highgpu-8g", "us-central1-a")], quotes[("a3-highgpu-8g", "us-central1-b")]
    assert (a.obtainability, a.estimated_uptime_s) == (0.8, 7200.0)
    assert (b.obtainability, b.estimated_uptime_s) == (0.3, 1800.5)
    n1 = quotes[("n1-highmem-8", "us-central1-a")]  # asked, but the cloud had no advice for it
    assert (n1.obtainability, n1.estimated_uptime_s) == (None, None)
    assert source.notes == []
    # one request per GPU machine type and region, for Spot VMs in any one of the zones that sell it
    bodies = {tuple(r["instanceFlexibilityPolicy"]["instanceSelections"]["broker"]["machineTypes"]): r
              for r in advised.cloud.advice_requests}  # type: ignore[attr-defined]
    assert sorted(bodies) == [("a3-highgpu-8g",), ("n1-highmem-8",)]
    a3 = bodies[("a3-highgpu-8g",)]
    assert a3["instanceProperties"] == {"scheduling": {"provisioningModel": "SPOT"}} and a3["size"] == 1
    assert a3["distributionPolicy"] == {"zones": [{"zone": "zones/us-central1-a"}, {"zone": "zones/us-central1-b"}],
                                        "targetShape": "ANY_SINGLE_ZONE"}


def test_capacity_advice_is_cached_until_it_is_older_than_its_ttl(advised: FakeServer) -> None:
    from providers.capacity import TtlCache

    now = [0.0]
    source = _source(advised)
    source.advice_cache = TtlCache(600.0, clock=lambda: now[0])
    source.fetch_quotes()
    source.fetch_quotes()
    assert advised.requests["adviceCapacity"] == 2  # the second refresh asked nothing
    now[0] = 601.0
    quotes = _by_offer(source.fetch_quotes())
    assert advised.requests["adviceCapacity"] == 4
    assert quotes[("a3-highgpu-8g", "us-central1-a")].obtainability == 0.8


def test_capacity_advice_throttled_is_retried_and_refused_loses_only_the_advice(advised: FakeServer) -> None:
    advised.fail("adviceCapacity", 429, times=1)
    quotes = _by_offer(_source(advised).fetch_quotes())
    assert quotes[("a3-highgpu-8g", "us-central1-a")].obtainability == 0.8
    assert advised.requests["adviceCapacity"] == 2 + 1
    advised.fail("adviceCapacity", 403, times=None, code="Required 'compute.advice.capacity' permission")
    source = _source(advised)
    quotes = _by_offer(source.fetch_quotes())
    a3 = quotes[("a3-highgpu-8g", "us-central1-a")]
    assert a3.spot_price == pytest.approx(A3_SPOT, abs=1e-6) and a3.obtainability is None
    assert source.notes == ["gcp: advice.capacity us-central1 a3-highgpu-8g unavailable (HTTP 403)",
                            "gcp: advice.capacity us-central1 n1-highmem-8 unavailable (HTTP 403)"]


def _advice(obtainability: object, uptime: object, zone: object = "us-central1-a") -> bytes:
    import json

    return json.dumps({"recommendations": [{"scores": {"obtainability": obtainability, "estimatedUptime": uptime},
                                            "shards": [{"zone": zone, "machineType": "a3-highgpu-8g"}]}]}).encode()


@pytest.mark.parametrize(("body", "kept", "note"), [
    (_advice(1.7, "3600s"), (None, 3600.0), "recommendations[0].scores.obtainability: out of range 0-1 (1.7)"),
    (_advice(-0.1, "3600s"), (None, 3600.0), "obtainability: out of range"),
    (_advice("0.9", "3600s"), (None, 3600.0), "obtainability: not a number ('0.9')"),
    (_advice(True, "3600s"), (None, 3600.0), "obtainability: not a number (True)"),
    (_advice(0.5, "forever"), (0.5, None), "recommendations[0].scores.estimatedUptime: not a duration"),
    (_advice(0.5, "99999999999s"), (0.5, None), "estimatedUptime: out of range, over a year"),
    (_advice(0.5, -5), (0.5, None), "estimatedUptime: not a duration"),
    (_advice(0.5, "60s", zone="../\x00\ud800"), (None, None), "shards[0]: no usable zone or machineType"),
    (b'{"recommendations": [{"scores": {"obtainability": NaN}, "shards": []}]}', (None, None),
     "unavailable (BodyRefused: answer has a bare NaN)"),
    (b"<html>503 Service Unavailable</html>", (None, None), "unavailable (BodyRefused: answer is not JSON"),
    (b"[" * 200_000 + b"]" * 200_000, (None, None), "answer is not JSON (RecursionError)"),
    (b'{"recommendations": "' + b"x" * 3_000_000 + b'"}', (None, None), "answer over 2097152 bytes"),
    (b'{"recommendations": {"a": 1}}', (None, None), "recommendations: not a list"),
    (b'{"recommendations": [7, {"scores": 1}]}', (None, None), "recommendations[0]: no scores or shards"),
])
def test_hostile_capacity_advice_is_refused_per_field(body: bytes, kept: tuple[object, object], note: str) -> None:
    fake = FakeGcp(_skus(), _machine_types(), _accelerator_types())
    fake.advice_body = body
    with FakeServer(fake) as server:
        source = _source(server)
        quotes = _by_offer(source.fetch_quotes())
    a3 = quotes[("a3-highgpu-8g", "us-central1-a")]
    assert a3.spot_price == pytest.approx(A3_SPOT, abs=1e-6)  # the prices are never lost
    assert (a3.obtainability, a3.estimated_uptime_s) == kept
    assert any(note in line and line.startswith("gcp: advice.capacity us-central1 ") for line in source.notes), \
        source.notes
    assert all(len(line) < 400 for line in source.notes)


def test_capacity_advice_can_be_turned_off(advised: FakeServer) -> None:
    quotes = _source(advised, capacity_advice=False).fetch_quotes()
    assert {q.obtainability for q in quotes} == {None} and advised.requests["adviceCapacity"] == 0
