"""The clouds' own price history in the price book: stored before what the broker polled itself,
once per process and cloud, and exported as a market trace to simulate on."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from broker.market import backfill
from broker.market.book import PriceBook
from broker.market.polling import poll_prices
from broker.store import open_store
from providers.base import SpotQuote
from providers.trace import read_trace
from tests.fakeclouds.gcp import FakeGcp
from tests.fakeclouds.server import FakeServer
from tests.providers.test_gcp import _accelerator_types, _machine_types, _skus, _source

T0 = datetime(2026, 3, 1, 12, tzinfo=UTC)


@pytest.fixture
def book(db_url: str) -> Iterator[PriceBook]:
    store = open_store(db_url)
    yield PriceBook(store)
    store.dispose()


def _q(spot: float, at: datetime, rate: float | None = None) -> SpotQuote:
    return SpotQuote("aws", "us-east-1", "us-east-1a", "p5.48xlarge", "H100", 8, spot, 98.32, at,
                     preemption_rate=rate)


def test_history_goes_before_the_books_own_quotes_and_never_among_them(book: PriceBook) -> None:
    book.record("aws", [_q(30.0, T0)], at=T0)
    past = [_q(40.0, T0 - timedelta(days=2)), _q(40.0, T0 - timedelta(days=1, hours=12)),  # no change: one row
            _q(35.0, T0 - timedelta(days=1)), _q(99.0, T0 + timedelta(hours=1))]  # after the book's own: dropped
    assert book.backfill("aws", past) == 2
    series = book.series(_q(0, T0).key, since=T0 - timedelta(days=3), until=T0 + timedelta(hours=2))
    assert [(q.observed_at, q.spot_price) for q in series] == [
        (T0 - timedelta(days=2), 40.0), (T0 - timedelta(days=1), 35.0), (T0, 30.0)]
    assert book.latest()[0].spot_price == 30.0  # the newest stays what the broker polled
    assert book.backfill("aws", past) == 0  # again: nothing older than what is there now
    with pytest.raises(ValueError, match="got a quote for cloud 'gcp'"):
        book.backfill("aws", [replace(_q(1.0, T0), cloud="gcp")])


DAYS = [(datetime.now(UTC) - timedelta(days=ago)).date() for ago in (3, 2)]
HISTORY = {("us-central1", "a3-highgpu-8g"): [(DAYS[0].isoformat(), 0.40, 21.5), (DAYS[1].isoformat(), 0.25, 22.25)]}


def test_a_first_poll_backfills_once_and_the_export_replays_it(book: PriceBook, tmp_path: Path) -> None:
    with FakeServer(FakeGcp(_skus(), _machine_types(), _accelerator_types(), history=HISTORY)) as server:
        source = _source(server, capacity_advice=False)
        source.backfill_days = 7.0
        first = poll_prices(book, {"gcp": source})[0]
        again = poll_prices(book, {"gcp": source})[0]
    # two days in each of the region's two zones
    assert first.status == "ok" and any(n.startswith("gcp: backfilled 4 past quotes of 7 days") for n in first.notes)
    assert not any("backfilled" in n for n in again.notes)  # once per process and book
    path = tmp_path / "past.csv"
    start = datetime(DAYS[0].year, DAYS[0].month, DAYS[0].day, 8, tzinfo=UTC)  # the fake's midnight Pacific
    book.export_trace(path, since=start, until=start + timedelta(days=2), tick_seconds=86400)
    trace = read_trace(path)
    zone = next(i for i, z in enumerate(trace.zones) if (z.zone, z.instance_type) == ("us-central1-a", "a3-highgpu-8g"))
    assert trace.spot_price[:2, zone].tolist() == [21.5, 22.25]
    assert trace.signals["preemption_rate"][:2, zone].tolist() == [0.40, 0.25]
    assert trace.available_nodes[:2, zone].tolist() == [1, 1]  # the history says nothing of counts


def test_a_failing_history_says_so_and_keeps_the_poll(book: PriceBook) -> None:
    class Broken:
        def history(self, since: datetime) -> list[SpotQuote]:
            raise RuntimeError("the cloud said no\nsecond line")

    line = backfill.backfill_once(book, "aws", Broken(), 7.0, force=True)
    assert line == "aws: price history unavailable (RuntimeError: the cloud said no)"
    assert backfill.backfill_once(book, "aws", Broken(), 0.0, force=True) is None  # off
    assert backfill.backfill_once(book, "aws", object(), 7.0, force=True) is None  # no history to read
