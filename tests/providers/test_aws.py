from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import pytest
from botocore.exceptions import ClientError

from providers.aws import AwsPriceSource, latest_spot_prices, on_demand_prices
from providers.base import CloudUnavailable, SpotQuote
from tests.fakeclouds.aws import FakeAws, price_list_product, spot_record
from tests.fakeclouds.server import FakeServer
from tests.providers.conftest import FAST

NOW = datetime.now(UTC).replace(microsecond=0)
# moto's fixed zone ids for us-east-1 (the API answers placement scores by id, not name)
ZONE_IDS = {"us-east-1a": "use1-az6", "us-east-1b": "use1-az1", "us-east-1c": "use1-az2",
            "us-east-1d": "use1-az4", "us-east-1e": "use1-az3", "us-east-1f": "use1-az5"}
P5_SPOT = {"us-east-1a": 31.4671, "us-east-1b": 29.9872, "us-east-1c": 33.1020}


def _history() -> list[dict]:
    records = []
    for zone, price in P5_SPOT.items():
        records.append(spot_record("p5.48xlarge", zone, ZONE_IDS[zone], price, NOW - timedelta(minutes=20)))
        # an older price in force before: must lose to the newer one
        records.append(spot_record("p5.48xlarge", zone, ZONE_IDS[zone], price * 1.5, NOW - timedelta(days=2)))
    records.append(spot_record("p4d.24xlarge", "us-east-1a", ZONE_IDS["us-east-1a"], 8.7781, NOW))
    records.append(spot_record("m6i.2xlarge", "us-east-1b", ZONE_IDS["us-east-1b"], 0.1412, NOW))  # CPU-only
    # another region's record in the same history store: never returned for us-east-1
    records.append(spot_record("p5.48xlarge", "us-west-2a", "usw2-az1", 1.0, NOW))
    return records


def _products() -> list[dict]:
    return [
        price_list_product("p5.48xlarge", "us-east-1", 98.32, 8),
        price_list_product("p5.48xlarge", "us-east-1", 121.10, 8, operating_system="Windows"),
        price_list_product("p5.48xlarge", "us-east-1", 108.15, 8, tenancy="Dedicated"),
        price_list_product("p5.48xlarge", "us-east-1", 99.00, 8, capacity="UnusedCapacityReservation"),
        price_list_product("p4d.24xlarge", "us-east-1", 32.7726, 8),
        price_list_product("g5.xlarge", "us-east-1", 1.006, 1),
        price_list_product("m6i.2xlarge", "us-east-1", 0.384, 0, family="General purpose"),
        price_list_product("m6i.2xlarge", "us-east-1", 0.752, 0, family="General purpose", operating_system="Windows"),
    ]


@pytest.fixture
def aws(moto_url: str, aws_credentials: None, monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeServer]:
    scores = [{"InstanceType": "p5.48xlarge", "Region": "us-east-1", "AvailabilityZoneId": ZONE_IDS[z], "Score": s}
              for z, s in (("us-east-1a", 3), ("us-east-1b", 9), ("us-east-1c", 7))]
    fake = FakeAws(moto_url, _history(), scores, _products(), page_size=2)
    with FakeServer(fake) as server:
        monkeypatch.setenv("AWS_ENDPOINT_URL_EC2", server.url)
        monkeypatch.setenv("AWS_ENDPOINT_URL_PRICING", server.url)
        yield server


def _poll() -> dict[tuple[str, str], SpotQuote]:
    quotes = AwsPriceSource(regions=["us-east-1"], backoff=FAST).fetch_quotes()
    return {(q.instance_type, q.zone): q for q in quotes}


def _prices(quotes: dict[tuple[str, str], SpotQuote]) -> dict[tuple[str, str], tuple]:
    return {k: (q.spot_price, q.on_demand_price, q.capacity_score) for k, q in quotes.items()}


def test_p5_48xlarge_is_quoted_in_every_zone_that_offers_it(aws: FakeServer) -> None:
    quotes = _poll()
    p5 = {zone: q for (name, zone), q in quotes.items() if name == "p5.48xlarge"}
    # moto's offerings put p5.48xlarge in six zones; prices exist for three of them
    assert sorted(p5) == sorted(ZONE_IDS)
    for zone, q in p5.items():
        assert q.spot_price == P5_SPOT.get(zone)
        assert q.on_demand_price == 98.32
        assert (q.accelerator, q.gpus_per_node, q.gpu_memory_gb) == ("H100", 8, 80)
    assert [p5[z].capacity_score for z in ("us-east-1a", "us-east-1b", "us-east-1c", "us-east-1d")] == \
        [3.0, 9.0, 7.0, None]
    assert quotes[("p4d.24xlarge", "us-east-1a")].spot_price == 8.7781
    # pages of two history records each (the five prices in force now: the older p5 prices are
    # not in the window), and pages of price-list entries too: the GPU listing's two, then one
    # listing for each CPU family's instanceFamily (Compute optimized, General purpose, Memory
    # optimized), one page each
    assert aws.requests["DescribeSpotPriceHistory"] == 3
    assert aws.requests["GetProducts"] == 2 + 3


def test_the_catalogs_cpu_only_types_are_quoted_spot_and_on_demand_without_a_score(aws: FakeServer) -> None:
    quotes = _poll()
    m6i = quotes[("m6i.2xlarge", "us-east-1b")]
    assert (m6i.accelerator, m6i.gpus_per_node, m6i.spot_price, m6i.on_demand_price) == ("", 0, 0.1412, 0.384)
    assert m6i.capacity_score is None  # placement scores are asked for GPU types only
    spot_cpu = {key for key, q in quotes.items() if q.gpus_per_node == 0 and q.spot_price}
    assert spot_cpu == {("m6i.2xlarge", "us-east-1b")}
    # p5.48xlarge's scores in two pages, p4d.24xlarge's in one: none asked for the CPU type
    assert aws.requests["GetSpotPlacementScores"] == 3


def test_throttled_calls_are_retried(aws: FakeServer) -> None:
    baseline = _poll()
    baseline_scores = aws.requests["GetSpotPlacementScores"]
    aws.requests.clear()
    aws.fail("DescribeSpotPriceHistory", 503, times=2, code="RequestLimitExceeded")
    aws.fail("GetProducts", 429, times=1)
    aws.fail("GetSpotPlacementScores", 400, times=1, code="Throttling")
    assert _prices(_poll()) == _prices(baseline)
    assert aws.requests["DescribeSpotPriceHistory"] == 3 + 2
    assert aws.requests["GetProducts"] == 5 + 1
    assert aws.requests["GetSpotPlacementScores"] == baseline_scores + 1


def test_server_errors_are_retried_then_succeed(aws: FakeServer) -> None:
    aws.fail("DescribeSpotPriceHistory", 500, times=1)
    aws.fail("DescribeInstanceTypes", 500, times=1)
    quotes = _poll()
    assert quotes[("p5.48xlarge", "us-east-1b")].spot_price == P5_SPOT["us-east-1b"]
    assert aws.requests["DescribeInstanceTypes"] == 2


def test_a_server_error_that_persists_fails_the_poll(aws: FakeServer) -> None:
    aws.fail("DescribeSpotPriceHistory", 500, times=None)
    with pytest.raises(ClientError, match="InternalError"):
        _poll()
    assert aws.requests["DescribeSpotPriceHistory"] == FAST.attempts


def test_placement_score_refusal_keeps_the_prices(aws: FakeServer) -> None:
    aws.fail("GetSpotPlacementScores", 400, times=None, code="UnauthorizedOperation")
    source = AwsPriceSource(regions=["us-east-1"], backoff=FAST)
    quotes = source.fetch_quotes()
    assert {q.capacity_score for q in quotes} == {None}
    assert any(q.spot_price == P5_SPOT["us-east-1a"] for q in quotes)
    assert source.notes == ["aws: spot placement scores unavailable (UnauthorizedOperation)"]


def test_no_credentials_is_one_clear_line(monkeypatch: pytest.MonkeyPatch, aws_credentials: None) -> None:
    monkeypatch.delenv("AWS_ACCESS_KEY_ID")
    monkeypatch.delenv("AWS_SECRET_ACCESS_KEY")
    with pytest.raises(CloudUnavailable, match=r"^aws: no credentials found .*; skipped$"):
        AwsPriceSource(regions=["us-east-1"], backoff=FAST).fetch_quotes()


def test_latest_spot_price_wins_per_zone() -> None:
    old, new = NOW - timedelta(hours=3), NOW
    prices = latest_spot_prices([
        {"InstanceType": "p5.48xlarge", "AvailabilityZone": "us-east-1a", "SpotPrice": "40.1", "Timestamp": old},
        {"InstanceType": "p5.48xlarge", "AvailabilityZone": "us-east-1a", "SpotPrice": "31.5", "Timestamp": new},
        {"InstanceType": "p5.48xlarge", "AvailabilityZone": "us-east-1b", "SpotPrice": "30.0", "Timestamp": old},
    ])
    assert prices == {("p5.48xlarge", "us-east-1a"): 31.5, ("p5.48xlarge", "us-east-1b"): 30.0}


def test_on_demand_price_reads_linux_shared_from_price_list_strings() -> None:
    import json

    entries = [json.dumps(p) for p in _products()]
    assert on_demand_prices(entries) == {"p5.48xlarge": 98.32, "p4d.24xlarge": 32.7726, "g5.xlarge": 1.006,
                                        "m6i.2xlarge": 0.384}


def test_gpu_types_only_leaves_the_cpu_types_and_their_listings_out(aws: FakeServer) -> None:
    quotes = AwsPriceSource(regions=["us-east-1"], backoff=FAST, cpu_types=False).fetch_quotes()
    assert quotes and all(q.gpus_per_node > 0 for q in quotes)
    assert aws.requests["GetProducts"] == 2  # the GPU listing's two pages only


# -- spot price history, for the backfill --------------------------------------------------------

def test_the_price_history_reads_every_change_since_as_past_quotes(aws: FakeServer) -> None:
    source = AwsPriceSource(regions=["us-east-1"], backoff=FAST)
    assert source.history(NOW - timedelta(days=7)) == []  # nothing before a poll
    source.fetch_quotes()
    since = NOW - timedelta(days=3)
    past = source.history(since)
    a = [(q.observed_at, q.spot_price) for q in past if (q.instance_type, q.zone) == ("p5.48xlarge", "us-east-1a")]
    # the price in force since two days ago, then the change twenty minutes ago
    assert a == [(NOW - timedelta(days=2), round(P5_SPOT["us-east-1a"] * 1.5, 6)),
                 (NOW - timedelta(minutes=20), P5_SPOT["us-east-1a"])]
    first = next(q for q in past if q.instance_type == "p5.48xlarge")
    assert (first.on_demand_price, first.accelerator, first.gpus_per_node, first.capacity_score) == \
        (98.32, "H100", 8, None)
    assert {q.instance_type for q in past} == {"p5.48xlarge", "p4d.24xlarge"}  # GPU offers only
    assert all(q.observed_at >= since for q in past) and source.notes == []
    # a window that starts after the older price: that price is the one in force at its start
    late = [q for q in source.history(NOW - timedelta(days=1)) if q.zone == "us-east-1b"]
    assert [(q.observed_at, q.spot_price) for q in late] == [
        (NOW - timedelta(days=1), round(P5_SPOT["us-east-1b"] * 1.5, 6)),
        (NOW - timedelta(minutes=20), P5_SPOT["us-east-1b"])]


@pytest.mark.parametrize("price", ["NaN", "-1.0", "0", "inf", "abc", "1e400", "99999", "9" * 40])
def test_a_history_record_without_a_usable_price_is_left_out_with_a_note(
        moto_url: str, aws_credentials: None, monkeypatch: pytest.MonkeyPatch, price: str) -> None:
    history = _history()
    history.append({**spot_record("p5.48xlarge", "us-east-1c", ZONE_IDS["us-east-1c"], 1.0,
                                  NOW - timedelta(hours=5)), "SpotPrice": price})
    with FakeServer(FakeAws(moto_url, history, [], _products(), page_size=2)) as server:
        monkeypatch.setenv("AWS_ENDPOINT_URL_EC2", server.url)
        monkeypatch.setenv("AWS_ENDPOINT_URL_PRICING", server.url)
        source = AwsPriceSource(regions=["us-east-1"], backoff=FAST, placement_scores=False)
        source.fetch_quotes()
        source.notes = []
        past = source.history(NOW - timedelta(days=3))
    c = [q.spot_price for q in past if (q.instance_type, q.zone) == ("p5.48xlarge", "us-east-1c")]
    assert c == [round(P5_SPOT["us-east-1c"] * 1.5, 6), P5_SPOT["us-east-1c"]]
    assert source.notes == ["aws: spot price history us-east-1: 1 record(s) without a usable SpotPrice "
                            "(0-10000), Timestamp or known offer; left out"]


def test_a_refused_history_loses_only_the_history(aws: FakeServer) -> None:
    source = AwsPriceSource(regions=["us-east-1"], backoff=FAST)
    quotes = source.fetch_quotes()
    aws.fail("DescribeSpotPriceHistory", 403, times=None, code="UnauthorizedOperation")
    assert source.history(NOW - timedelta(days=3)) == []
    assert source.notes[-1] == "aws: spot price history us-east-1 unavailable (ClientError)"
    assert any(q.spot_price for q in quotes)
