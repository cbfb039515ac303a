"""GCP ``advice.capacityHistory`` against the stand-in that speaks its REST wire format: the daily
preemption rate on the quotes, the price history for the backfill, hostile answers refused per field."""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import UTC, datetime

import pytest

from providers.gcp_history import history_request
from tests.fakeclouds.gcp import FakeGcp
from tests.fakeclouds.server import FakeServer
from tests.providers.test_gcp import A3_SPOT, _accelerator_types, _by_offer, _machine_types, _skus, _source

HISTORY = {("us-central1", "a3-highgpu-8g"): [("2026-02-26", 0.40, 21.5), ("2026-02-27", 0.25, 22.25)],
           ("us-central1-b", "a3-highgpu-8g"): [("2026-02-27", 0.0, 20.0)]}  # a zone's: never asked for


@pytest.fixture
def historied() -> Iterator[FakeServer]:
    with FakeServer(FakeGcp(_skus(), _machine_types(), _accelerator_types(), history=HISTORY)) as server:
        yield server


def test_the_newest_days_preemption_rate_goes_on_each_spot_gpu_quote(historied: FakeServer) -> None:
    source = _source(historied, capacity_advice=False)
    quotes = _by_offer(source.fetch_quotes())
    assert quotes[("a3-highgpu-8g", "us-central1-a")].preemption_rate == 0.25
    assert quotes[("a3-highgpu-8g", "us-central1-b")].preemption_rate == 0.25  # the region's rate, every zone
    assert quotes[("n1-highmem-8", "us-central1-a")].preemption_rate is None  # asked; the cloud had none
    assert source.notes == []
    asked = historied.cloud.history_requests  # type: ignore[attr-defined]
    # one request per GPU machine type and region, the region being the path's
    assert {r["instanceProperties"]["machineType"] for r in asked} == {"a3-highgpu-8g", "n1-highmem-8"}
    assert history_request("a3-highgpu-8g") in asked and not any("locationPolicy" in r for r in asked)
    assert all(r["types"] == ["PREEMPTION", "PRICE"] and
               r["instanceProperties"]["scheduling"] == {"provisioningModel": "SPOT"} for r in asked)


def test_the_history_is_cached_for_hours_not_asked_again_each_refresh(historied: FakeServer) -> None:
    source = _source(historied, capacity_advice=False)
    source.fetch_quotes()
    first = historied.requests["adviceCapacityHistory"]
    source.fetch_quotes()
    assert first > 0 and historied.requests["adviceCapacityHistory"] == first


def test_the_price_history_becomes_past_quotes_for_the_backfill(historied: FakeServer) -> None:
    source = _source(historied, capacity_advice=False)
    assert source.history(datetime(2026, 1, 1, tzinfo=UTC)) == []  # nothing before a poll
    source.fetch_quotes()
    past = [q for q in source.history(datetime(2026, 1, 1, tzinfo=UTC)) if q.zone == "us-central1-a"]
    assert [(q.observed_at, q.spot_price, q.preemption_rate) for q in past] == [
        (datetime(2026, 2, 26, 8, tzinfo=UTC), 21.5, 0.40), (datetime(2026, 2, 27, 8, tzinfo=UTC), 22.25, 0.25)]
    assert {(q.instance_type, q.gpus_per_node, q.accelerator) for q in past} == {("a3-highgpu-8g", 8, "H100")}
    # only what ends after ``since``, starting no earlier than it
    recent = [q for q in source.history(datetime(2026, 2, 27, 12, tzinfo=UTC)) if q.zone == "us-central1-a"]
    assert [(q.observed_at, q.spot_price) for q in recent] == [(datetime(2026, 2, 27, 12, tzinfo=UTC), 22.25)]


def test_throttled_or_refused_history_loses_only_the_history(historied: FakeServer) -> None:
    historied.fail("adviceCapacityHistory", 429, times=1)
    quotes = _by_offer(_source(historied, capacity_advice=False).fetch_quotes())
    assert quotes[("a3-highgpu-8g", "us-central1-a")].preemption_rate == 0.25  # retried
    historied.fail("adviceCapacityHistory", 403, times=None, code="Required 'compute.advice.capacityHistory'")
    source = _source(historied, capacity_advice=False)
    quotes = _by_offer(source.fetch_quotes())
    a3 = quotes[("a3-highgpu-8g", "us-central1-a")]
    assert a3.spot_price == pytest.approx(A3_SPOT, abs=1e-6) and a3.preemption_rate is None
    assert "gcp: advice.capacityHistory us-central1 a3-highgpu-8g unavailable (HTTP 403)" in source.notes


def test_history_can_be_turned_off(historied: FakeServer) -> None:
    quotes = _source(historied, capacity_advice=False, capacity_history=False).fetch_quotes()
    assert {q.preemption_rate for q in quotes} == {None} and historied.requests["adviceCapacityHistory"] == 0


DAY = {"startTime": "2026-02-27T08:00:00Z", "endTime": "2026-02-28T08:00:00Z"}


def _answer(rate: object = 0.25, price: object = None, interval: object = None) -> bytes:
    money = {"currencyCode": "USD", "units": "22", "nanos": 250_000_000} if price is None else price
    span = DAY if interval is None else interval
    return json.dumps({"preemptionHistory": [{"interval": span, "preemptionRate": rate}],
                       "priceHistory": [{"interval": DAY, "listPrice": money}]}).encode()


@pytest.mark.parametrize(("body", "rate", "note"), [
    (_answer(rate=1.5), None, "preemptionHistory[0].preemptionRate: out of range 0-1 (1.5)"),
    (_answer(rate=-0.1), None, "preemptionRate: out of range 0-1"),
    (_answer(rate="0.2"), None, "preemptionRate: not a number ('0.2')"),
    (_answer(rate=None), None, "preemptionRate: not a number (None)"),
    (_answer(rate=True), None, "preemptionRate: not a number (True)"),
    (_answer(interval={"startTime": "yesterday", "endTime": "2026-02-28T08:00:00Z"}), None,
     "preemptionHistory[0].interval.startTime: not an RFC 3339 time"),
    (_answer(interval={"startTime": "2026-02-28T08:00:00Z", "endTime": "2026-02-27T08:00:00Z"}), None,
     "preemptionHistory[0].interval: not a span of up to 31 days"),
    (_answer(interval={"startTime": "2026-02-27T08:00:00Z\x00\ud800", "endTime": "x" * 5000}), None,
     "interval.startTime: not an RFC 3339 time"),
    (_answer(interval=[]), None, "preemptionHistory[0].interval: missing"),
    (_answer(price={"currencyCode": "EUR", "units": "22"}), 0.25, "priceHistory[0].listPrice.currencyCode: not USD"),
    (_answer(price={"currencyCode": "USD", "units": "9" * 30}), 0.25, "listPrice.units: not an integer"),
    (_answer(price={"currencyCode": "USD", "units": "2", "nanos": 10**12}), 0.25,
     "listPrice.nanos: not an integer within a unit"),
    (_answer(price={"currencyCode": "USD", "units": "-3"}), 0.25, "priceHistory[0].listPrice: out of range"),
    (_answer(price={"currencyCode": "USD", "units": "99999"}), 0.25, "priceHistory[0].listPrice: out of range"),
    (b'{"preemptionHistory": {"a": 1}}', None, "preemptionHistory: not a list"),
    (b'{"preemptionHistory": [7]}', None, "preemptionHistory[0]: not an object"),
    (b'[1, 2]', None, "advice.capacityHistory us-central1 a3-highgpu-8g: not an object"),
    (b'{"preemptionHistory": [{"preemptionRate": NaN}]}', None, "unavailable (BodyRefused: answer has a bare NaN)"),
    (b"<html>503</html>", None, "unavailable (BodyRefused: answer is not JSON"),
    (b"[" * 200_000 + b"]" * 200_000, None, "answer is not JSON (RecursionError)"),
    (b'{"priceHistory": "' + b"x" * 3_000_000 + b'"}', None, "answer over 2097152 bytes"),
    (json.dumps({"preemptionHistory": [{"interval": DAY, "preemptionRate": 0.1}] * 500}).encode(), 0.1,
     "preemptionHistory: 500 records; the first 400 kept"),
])
def test_hostile_history_is_refused_per_field(body: bytes, rate: float | None, note: str) -> None:
    fake = FakeGcp(_skus(), _machine_types(), _accelerator_types())
    fake.history_body = body
    with FakeServer(fake) as server:
        source = _source(server, capacity_advice=False)
        quotes = _by_offer(source.fetch_quotes())
    a3 = quotes[("a3-highgpu-8g", "us-central1-a")]
    assert a3.spot_price == pytest.approx(A3_SPOT, abs=1e-6)  # the prices are never lost
    assert a3.preemption_rate == rate
    assert any(note in line and line.startswith("gcp: advice.capacityHistory ") for line in source.notes), \
        source.notes
    assert all(len(line) < 400 and "\x00" not in line for line in source.notes)
