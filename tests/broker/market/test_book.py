from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path

import numpy as np
import pytest

from broker.market.book import NoQuotes, PriceBook, QuoteFilter
from broker.store import open_store
from providers.base import OfferKey, SpotQuote
from providers.trace import read_trace

T0 = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)


def _q(cloud: str, zone: str, instance_type: str, spot: float | None, on_demand: float | None = 10.0,
       accelerator: str = "H100", gpus: int = 8, score: float | None = None) -> SpotQuote:
    region = zone if cloud == "azure" else zone.rsplit("-", 1)[0] if cloud == "gcp" else zone[:-1]
    return SpotQuote(cloud=cloud, region=region, zone=zone, instance_type=instance_type, accelerator=accelerator,
                     gpus_per_node=gpus, spot_price=spot, on_demand_price=on_demand, observed_at=T0,
                     gpu_memory_gb=80, capacity_score=score)


@pytest.fixture
def book(db_url: str) -> Iterator[PriceBook]:
    store = open_store(db_url)
    yield PriceBook(store)
    store.dispose()


def _latest(book: PriceBook, **where: object) -> dict[tuple[str, str], SpotQuote]:
    return {(q.zone, q.instance_type): q for q in book.latest(QuoteFilter(**where))}  # type: ignore[arg-type]


def test_unchanged_quotes_extend_a_row_and_changes_start_one(book: PriceBook) -> None:
    a = _q("aws", "us-east-1a", "p5.48xlarge", 31.0, 98.32, score=9)
    b = _q("aws", "us-east-1b", "p5.48xlarge", 29.0, 98.32)
    assert book.record("aws", [a, b], at=T0).inserted == 2
    seen_again = book.record("aws", [a, b], at=T0 + timedelta(minutes=5))
    assert (seen_again.inserted, seen_again.confirmed) == (0, 2)
    book.record("aws", [replace(a, spot_price=35.5), b], at=T0 + timedelta(minutes=10))

    latest = _latest(book)
    assert latest[("us-east-1a", "p5.48xlarge")].spot_price == 35.5
    assert latest[("us-east-1a", "p5.48xlarge")].observed_at == T0 + timedelta(minutes=10)
    assert latest[("us-east-1b", "p5.48xlarge")].observed_at == T0 + timedelta(minutes=10)
    assert latest[("us-east-1a", "p5.48xlarge")].capacity_score == 9

    then = {q.zone: q for q in book.at(T0 + timedelta(minutes=7))}
    assert then["us-east-1a"].spot_price == 31.0
    assert then["us-east-1a"].observed_at == T0 + timedelta(minutes=5)  # last seen before that moment
    assert book.at(T0 - timedelta(seconds=1)) == []

    series = book.series(OfferKey("aws", "us-east-1", "us-east-1a", "p5.48xlarge"), since=T0 + timedelta(minutes=1))
    assert [(q.spot_price, q.observed_at) for q in series] == [(31.0, T0), (35.5, T0 + timedelta(minutes=10))]


def test_a_failed_poll_keeps_that_clouds_quotes_marked_stale(book: PriceBook) -> None:
    book.record("aws", [_q("aws", "us-east-1a", "p5.48xlarge", 31.0)], at=T0)
    book.record("gcp", [_q("gcp", "us-central1-a", "a3-highgpu-8g", 21.28)], at=T0)
    assert book.mark_stale("aws") == 1
    assert book.mark_stale("aws") == 1  # a second failure keeps the same quote, still stale
    latest = _latest(book)
    assert latest[("us-east-1a", "p5.48xlarge")].stale
    assert latest[("us-east-1a", "p5.48xlarge")].observed_at == T0  # its age keeps growing
    assert not latest[("us-central1-a", "a3-highgpu-8g")].stale
    # the next good poll brings a fresh row even at the same price
    assert book.record("aws", [_q("aws", "us-east-1a", "p5.48xlarge", 31.0)], at=T0 + timedelta(hours=1)).inserted == 1
    assert not _latest(book)[("us-east-1a", "p5.48xlarge")].stale


def test_offers_a_poll_no_longer_lists_go_stale_only_in_polled_regions(book: PriceBook) -> None:
    book.record("aws", [_q("aws", "us-east-1a", "p5.48xlarge", 31.0), _q("aws", "us-east-1b", "p5.48xlarge", 30.0),
                        _q("aws", "us-west-2a", "p5.48xlarge", 28.0)], at=T0)
    result = book.record("aws", [_q("aws", "us-east-1a", "p5.48xlarge", 31.0)], at=T0 + timedelta(minutes=5),
                         regions=["us-east-1"])
    assert result.gone == 1
    latest = _latest(book)
    assert latest[("us-east-1b", "p5.48xlarge")].stale and not latest[("us-west-2a", "p5.48xlarge")].stale


def test_filters(book: PriceBook) -> None:
    book.record("aws", [_q("aws", "us-east-1a", "p5.48xlarge", 31.0),
                        _q("aws", "us-east-1a", "g6.xlarge", 0.4, 0.8, accelerator="L4", gpus=1)], at=T0)
    book.record("azure", [_q("azure", "eastus", "Standard_ND96asr_v4", 10.9, 27.2, accelerator="A100")], at=T0)
    assert set(_latest(book, accelerator="h100")) == {("us-east-1a", "p5.48xlarge")}
    assert set(_latest(book, min_gpus=8)) == {("us-east-1a", "p5.48xlarge"), ("eastus", "Standard_ND96asr_v4")}
    assert set(_latest(book, clouds=("azure",))) == {("eastus", "Standard_ND96asr_v4")}
    assert set(_latest(book, regions=("us-east-1",), accelerator="L4")) == {("us-east-1a", "g6.xlarge")}


def test_export_resamples_irregular_polls_onto_even_ticks(book: PriceBook, tmp_path: Path) -> None:
    a = _q("aws", "us-east-1a", "p5.48xlarge", 30.0, 98.32, score=8)
    b = _q("aws", "us-east-1b", "p5.48xlarge", 33.0, 98.32)
    book.record("aws", [a], at=T0 + timedelta(seconds=40))
    book.record("aws", [a, b], at=T0 + timedelta(minutes=3, seconds=10))  # b first seen
    book.record("aws", [replace(a, spot_price=36.0), b], at=T0 + timedelta(minutes=7))
    book.record("aws", [replace(a, spot_price=36.0, capacity_score=2), b], at=T0 + timedelta(minutes=13))
    book.record("aws", [replace(a, spot_price=36.0, capacity_score=2), b], at=T0 + timedelta(minutes=21))
    book.mark_stale("aws")

    path = tmp_path / "mine.csv.gz"
    export = book.export_trace(path, since=T0, until=T0 + timedelta(hours=1), tick_seconds=300)
    trace = read_trace(path)
    # ticks start at the first observation and stop at the last confirmation: 0:40 .. 20:40
    assert trace.start == T0 + timedelta(seconds=40) and trace.tick_seconds == 300
    assert (export.ticks, export.zones, export.rows) == (5, 2, 10) and trace.num_ticks == 5
    zone = {z.zone: i for i, z in enumerate(trace.zones)}
    a_col, b_col = zone["us-east-1a"], zone["us-east-1b"]
    np.testing.assert_allclose(trace.spot_price[:, a_col], [30.0, 30.0, 36.0, 36.0, 36.0])
    # a placement score of 2 says a launch is unlikely: no capacity from 13:00 on
    assert trace.available_nodes[:, a_col].tolist() == [1, 1, 1, 0, 0]
    # b is not known at the first tick: carried back at its first price, with no capacity
    np.testing.assert_allclose(trace.spot_price[:, b_col], [33.0] * 5)
    assert trace.available_nodes[:, b_col].tolist() == [0, 1, 1, 1, 1]
    np.testing.assert_allclose(trace.on_demand_price, 98.32)


def test_export_after_a_failure_counts_stale_time_as_no_capacity(book: PriceBook, tmp_path: Path) -> None:
    a = _q("gcp", "us-central1-a", "a3-highgpu-8g", 21.28, 92.37)
    book.record("gcp", [a], at=T0)
    book.record("gcp", [a], at=T0 + timedelta(minutes=10))
    book.mark_stale("gcp")
    book.record("gcp", [a], at=T0 + timedelta(minutes=30))
    trace = read_trace(book.export_trace(tmp_path / "t.csv", since=T0, until=T0 + timedelta(minutes=30),
                                         tick_seconds=600).path)
    assert trace.available_nodes[:, 0].tolist() == [1, 1, 0, 1]


def test_export_of_an_empty_window_writes_nothing(book: PriceBook, tmp_path: Path) -> None:
    book.record("aws", [_q("aws", "us-east-1a", "p5.48xlarge", 31.0)], at=T0)
    path = tmp_path / "none.csv"
    with pytest.raises(NoQuotes, match="no quotes"):
        book.export_trace(path, since=T0 + timedelta(days=1), where=QuoteFilter(clouds=("gcp",)))
    assert not path.exists()


def test_capacity_signals_are_kept_with_the_quote_and_a_change_starts_a_row(book: PriceBook) -> None:
    g = replace(_q("gcp", "us-central1-a", "a3-highgpu-8g", 20.0, 88.0), obtainability=0.8, estimated_uptime_s=7200.0)
    z = replace(_q("azure", "eastus", "Standard_ND96isr_H100_v5", 25.0, 98.0), placement_level="High")
    book.record("gcp", [g], at=T0)
    book.record("azure", [z], at=T0)
    assert book.record("gcp", [g], at=T0 + timedelta(minutes=5)).inserted == 0
    assert book.record("gcp", [replace(g, obtainability=0.2)], at=T0 + timedelta(minutes=10)).inserted == 1
    assert book.record("gcp", [replace(g, obtainability=0.2, preemption_rate=0.1)],
                       at=T0 + timedelta(minutes=15)).inserted == 1
    latest = _latest(book)
    assert (latest[("us-central1-a", "a3-highgpu-8g")].obtainability,
            latest[("us-central1-a", "a3-highgpu-8g")].estimated_uptime_s) == (0.2, 7200.0)
    assert latest[("us-central1-a", "a3-highgpu-8g")].preemption_rate == 0.1
    assert latest[("eastus", "Standard_ND96isr_H100_v5")].placement_level == "High"


def test_export_carries_the_capacity_signals_as_optional_columns(book: PriceBook, tmp_path: Path) -> None:
    g = replace(_q("gcp", "us-central1-a", "a3-highgpu-8g", 20.0, 88.0), obtainability=0.8, estimated_uptime_s=7200.0,
                preemption_rate=0.25)
    a = _q("aws", "us-east-1a", "p5.48xlarge", 31.0, 98.32, score=9)
    book.record("gcp", [g], at=T0)
    book.record("aws", [a], at=T0)
    book.record("gcp", [replace(g, obtainability=0.3)], at=T0 + timedelta(minutes=10))
    book.record("aws", [a], at=T0 + timedelta(minutes=10))
    path = tmp_path / "signals.csv"
    book.export_trace(path, since=T0, until=T0 + timedelta(minutes=10), tick_seconds=300)
    assert path.read_text().splitlines()[0].endswith(
        "available_nodes,capacity_score,obtainability,estimated_uptime_s,placement_level,preemption_rate")
    trace = read_trace(path)
    by_zone = {z.zone: i for i, z in enumerate(trace.zones)}
    gcp, aws = by_zone["us-central1-a"], by_zone["us-east-1a"]
    assert trace.signals["obtainability"][:, gcp].tolist() == [0.8, 0.8, 0.3]
    assert trace.signals["estimated_uptime_s"][:, gcp].tolist() == [7200.0] * 3
    assert trace.signals["capacity_score"][:, aws].tolist() == [9.0] * 3
    assert trace.signals["preemption_rate"][:, gcp].tolist() == [0.25] * 3
    assert np.isnan(trace.signals["placement_level"]).all() and np.isnan(trace.signals["obtainability"][:, aws]).all()
