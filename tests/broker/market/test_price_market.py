"""The price book as the engine's market: what a decision sees per zone, the catalog only as fallback."""

from __future__ import annotations

from collections.abc import Iterable
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from broker.clock import AcceleratedClock
from broker.market.book import PriceBook
from broker.market.price_market import CATALOG, PRICE_BOOK, PriceBookMarket, quote_age_s
from broker.store import Store, open_store
from providers.base import OfferKey, SpotQuote
from tests.skystandin.server import SkyStandIn

T0 = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
EAST = OfferKey("aws", "us-east-1", "us-east-1a", "p3.2xlarge")
WEST = OfferKey("aws", "us-west-2", "us-west-2b", "p3.2xlarge")


def aws(key: OfferKey, spot: float, score: float | None = None) -> SpotQuote:
    return SpotQuote(key.cloud, key.region, key.zone, key.instance_type, "V100", 1, spot, 3.06, T0,
                     capacity_score=score)


class Catalog:
    """SkyPilot's catalog as the market reads it: an H100 offer nobody polled, and a cheap V100 one."""

    def __init__(self, fail: bool = False) -> None:
        self.fail = fail
        self.asked: list[set[str]] = []

    def quotes_for(self, names: Iterable[str], when: datetime) -> list[SpotQuote]:
        wanted = {n.lower() for n in names}
        self.asked.append(wanted)
        if self.fail:
            raise ConnectionError("Failed to fetch AWS catalog aws/vms.csv")
        offers = [SpotQuote("gcp", "us-central1", "us-central1-a", "a3-highgpu-1g", "H100", 1, 3.1, 11.0, when),
                  SpotQuote("aws", "us-east-2", "us-east-2a", "p3.2xlarge", "V100", 1, 0.10, 3.06, when)]
        return [q for q in offers if q.accelerator.lower() in wanted]

    def quote(self, key: OfferKey, when: datetime) -> SpotQuote:
        return SpotQuote(key.cloud, key.region, key.zone, key.instance_type, "H100", 1, 3.1, 11.0, when)


@pytest.fixture
def store(tmp_path: Path) -> Store:
    return open_store(f"sqlite:///{tmp_path / 'broker.db'}")


def test_every_zone_carries_its_price_capacity_and_staleness(store: Store) -> None:
    book = PriceBook(store)
    book.record("aws", [aws(EAST, 0.92, score=9.0), aws(WEST, 1.01, score=2.0)], at=T0)
    market = PriceBookMarket(book, stale_after_s=600)
    seen = {o.quote.zone: o for o in market.offers(T0 + timedelta(minutes=4))}
    assert seen["us-east-1a"].quote.spot_price == 0.92 and seen["us-east-1a"].quote.available_nodes is None
    assert seen["us-west-2b"].quote.available_nodes == 0  # a placement score of 2: a launch is unlikely
    assert seen["us-east-1a"].source == PRICE_BOOK and seen["us-east-1a"].age_s == pytest.approx(240)
    later = {o.quote.zone: o.quote for o in market.offers(T0 + timedelta(minutes=11))}
    assert later["us-east-1a"].stale and later["us-east-1a"].available_nodes == 0  # unconfirmed past 10 min
    book.record("aws", [aws(WEST, 1.01, score=9.0)], at=T0 + timedelta(minutes=12), regions=["us-east-1"])
    now = {o.quote.zone: o.quote for o in market.offers(T0 + timedelta(minutes=12))}
    assert now["us-east-1a"].stale  # the cloud stopped listing it
    assert not now["us-west-2b"].stale and now["us-west-2b"].available_nodes is None


def test_a_quote_is_the_one_in_force_at_the_minute_asked(store: Store) -> None:
    book = PriceBook(store)
    book.record("aws", [aws(EAST, 0.92)], at=T0)
    book.record("aws", [aws(EAST, 1.40)], at=T0 + timedelta(minutes=30))
    market = PriceBookMarket(book)
    assert market.quote(EAST, T0 + timedelta(minutes=29)).spot_price == 0.92
    assert market.quote(EAST, T0 + timedelta(minutes=30)).spot_price == 1.40
    assert market.quote(EAST, T0 - timedelta(minutes=1)).spot_price is None  # before the book heard of it
    assert quote_age_s(book, ["v100"], T0 + timedelta(minutes=35)) == pytest.approx(300)
    assert quote_age_s(book, ["H100"], T0) is None
    assert quote_age_s(book, [], T0) is None  # a CPU task: no CPU-only offer quoted yet
    book.record("gcp", [SpotQuote("gcp", "us-central1", "us-central1-a", "c2-standard-16", "", 0, 0.25, 0.83,
                                  T0)], at=T0 + timedelta(minutes=20))
    assert quote_age_s(book, [], T0 + timedelta(minutes=35)) == pytest.approx(900)
    assert quote_age_s(book, ["v100"], T0 + timedelta(minutes=35)) == pytest.approx(300)


def test_the_catalog_fills_in_only_accelerators_the_book_never_quoted(store: Store) -> None:
    book = PriceBook(store)
    book.record("aws", [aws(EAST, 0.92)], at=T0)
    catalog = Catalog()
    market = PriceBookMarket(book, catalog, wanted=lambda: ["V100", "H100"])
    offers = market.offers(T0)
    assert {(o.quote.instance_type, o.source) for o in offers} == {("p3.2xlarge", PRICE_BOOK),
                                                                  ("a3-highgpu-1g", CATALOG)}
    assert all(o.quote.zone != "us-east-2a" for o in offers)  # the catalog's V100 price never competes
    assert catalog.asked == [{"h100"}]


def test_an_unreadable_catalog_leaves_the_book_and_is_not_asked_again_at_once(store: Store) -> None:
    book = PriceBook(store)
    book.record("aws", [aws(EAST, 0.92)], at=T0)
    catalog = Catalog(fail=True)
    market = PriceBookMarket(book, catalog, wanted=lambda: ["H100"], retry_s=600)
    assert [o.quote.zone for o in market.offers(T0)] == ["us-east-1a"]
    assert [o.quote.zone for o in market.offers(T0)] == ["us-east-1a"]
    assert len(catalog.asked) == 1


def test_a_decision_sees_each_zones_recent_past_from_the_book(store: Store, tmp_path: Path,
                                                              skypilot: SkyStandIn) -> None:
    """A day of polls: us-east-1a is the cheaper zone but its placement score has dropped below 4
    for 10 minutes of every 20; us-west-2b's (at 0.90) for 10 minutes of every 6 hours, three hours
    ago last. Now both score 9. The engine's request carries
    that past per zone, bounded, and the default policy, seeing it, prices the flapping zone's short
    runs and starts in the steady one; with no past kept it takes the cheaper price."""
    from broker.backends.skypilot.provisioner import SkyPilotProvisioner
    from broker.backends.skypilot.runtime import store_specs
    from broker.engine import Engine, EngineOptions
    from broker.spec.job import parse_job_spec
    from broker.store.tables import JobRow
    from broker.tokens import SharedAgentTokens
    from policies import kinds
    from policies.selection import IDLE, Location

    now = datetime.now(UTC).replace(microsecond=0)
    book = PriceBook(store)
    for minutes in range(24 * 60, -1, -5):
        at = now - timedelta(minutes=minutes)
        east_down = minutes > 0 and minutes % 20 < 10
        west_down = 180 <= minutes % 360 < 190
        book.record("aws", [aws(EAST, 0.80, score=2.0 if east_down else 9.0),
                            aws(WEST, 0.90, score=2.0 if west_down else 9.0)], at=at)
    job_text = "name: train\nnum_nodes: 2\nresources:\n  accelerators: V100:1\nrun: python train.py\n"

    def first_choice(market: PriceBookMarket) -> tuple[str, object]:
        clock = AcceleratedClock(now.timestamp(), 1e-12)  # standing at ``now``
        engine = Engine(store, clock, market, SkyPilotProvisioner(tmp_path, store_specs(store), sdk=skypilot.sdk()),
                        EngineOptions(home=tmp_path), tokens=SharedAgentTokens(store, tmp_path))
        job_id = engine.submit(parse_job_spec(job_text, offline=True))
        with store.transaction() as s:
            job = s.get(JobRow, job_id)
            assert job is not None
            request = engine.selection_request(s, job, Location(IDLE), set())
            job.state = "CANCELLED"
        plan = kinds.selection.get("broker")(request)
        return plan.locations[0].label, request.history

    zone, history = first_choice(PriceBookMarket(book))
    assert history is not None and history.tick_seconds == 300
    assert history.series.num_ticks == 24 * 12 + 1  # a day of five-minute ticks, the last one now
    east, west = history.column(str(EAST)), history.column(str(WEST))
    assert east is not None and west is not None
    assert (history.spot_price[:, east] == 0.80).all() and (history.on_demand_price[:, west] == 3.06).all()
    assert (history.available_nodes[:, west] == 0).sum() == 2 * 4  # two ticks down in every 72
    assert (history.available_nodes[:, east] == 0).sum() == 2 * 72  # two ticks down in every four
    assert history.available_nodes[-1, east] > 0
    assert zone == "us-west-2b"
    bounded = PriceBookMarket(book, history_cells=2 * 10)
    _, short = first_choice(bounded)
    assert short is not None and short.series.num_ticks == 10  # at most 20 ticks x offers
    zone, history = first_choice(PriceBookMarket(book, history_cells=0))
    assert history is None and zone == "us-east-1a"


def test_a_quote_nobody_confirmed_for_stale_after_s_is_no_capacity_in_the_past_too(store: Store) -> None:
    book = PriceBook(store)
    book.record("aws", [aws(EAST, 0.92), aws(WEST, 1.01)], at=T0)
    book.record("aws", [aws(WEST, 1.01)], at=T0 + timedelta(minutes=30), regions=["us-west-2"])
    market = PriceBookMarket(book, stale_after_s=600)
    past = market.recent([EAST, WEST], T0 + timedelta(minutes=30))
    assert past is not None and past.num_ticks == 7
    east = [z.key for z in past.zones].index(EAST)
    # Quoted at T0 and never again: capacity for 10 minutes (stale_after_s), none after.
    assert past.available_nodes[:, east].tolist() == [1_000_000] * 3 + [0] * 4
    assert market.recent([], T0) is None
    assert market.recent([OfferKey("gcp", "us-central1", "us-central1-a", "a2-highgpu-1g")], T0) is None


def test_a_recent_past_is_reused_for_a_minute_then_rebuilt_with_the_new_quotes(store: Store) -> None:
    book = PriceBook(store)
    book.record("aws", [aws(EAST, 0.92)], at=T0)
    market = PriceBookMarket(book)
    first = market.recent([EAST], T0 + timedelta(minutes=10))
    book.record("aws", [aws(EAST, 1.50)], at=T0 + timedelta(minutes=10, seconds=20))
    again = market.recent([EAST], T0 + timedelta(minutes=10, seconds=30))
    assert again is first  # within a minute: the same past, not a new query
    later = market.recent([EAST], T0 + timedelta(minutes=11, seconds=5))
    assert first is not None and later is not None
    assert first.spot_price[-1, 0] == 0.92 and later.spot_price[-1, 0] == 1.50


def test_gcp_obtainability_and_azure_placement_level_are_capacity_signals_too(store: Store) -> None:
    from dataclasses import replace

    from broker.engine.planning import offer_of

    book = PriceBook(store)
    gcp = SpotQuote("gcp", "us-central1", "us-central1-a", "a3-highgpu-8g", "H100", 8, 20.0, 88.0, T0)
    book.record("gcp", [replace(gcp, obtainability=0.9), replace(gcp, zone="us-central1-b", obtainability=0.1)], at=T0)
    nd = SpotQuote("azure", "eastus", "eastus-1", "Standard_ND96isr_H100_v5", "H100", 8, 25.0, 98.0, T0)
    book.record("azure", [replace(nd, placement_level="High"), replace(nd, zone="eastus-2", placement_level="Low")],
                at=T0)
    seen = {o.quote.zone: o.quote for o in PriceBookMarket(book, stale_after_s=600).offers(T0)}
    assert seen["us-central1-a"].available_nodes is None and seen["eastus-1"].available_nodes is None
    assert seen["us-central1-b"].available_nodes == 0  # obtainability 0.1: a launch is unlikely
    assert seen["eastus-2"].available_nodes == 0  # placement level Low
    # the selection policy sees each zone's signal on the common 1-10 scale
    assert offer_of(seen["us-central1-a"]).capacity_score == pytest.approx(9.1)
    assert offer_of(seen["eastus-2"]).capacity_score == 2.0
