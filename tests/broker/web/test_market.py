"""The Market page's reading of the price book: one row per GPU type, its cheapest live spot offer, CPU apart."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from broker.web.market import NO_RUNS, Hazard, MarketFilter, MarketQueryError, Offer, gpu_rows

NOW = datetime(2026, 3, 1, 12, tzinfo=UTC)


def _offer(cloud: str, zone: str, itype: str, acc: str, gpus: int, spot: float | None, od: float | None,
           stale: bool = False, age_min: int = 5) -> Offer:
    return Offer(cloud, zone[:-1], zone, itype, acc, gpus, spot, od, 7.0, 3, stale, NOW - timedelta(minutes=age_min))


def test_one_row_per_gpu_type_with_the_cheapest_live_spot_per_gpu_and_the_cheapest_on_demand() -> None:
    offers = [_offer("aws", "us-east-1a", "p4d.24xlarge", "A100", 8, 9.8, 32.77),  # 1.225 a GPU
              _offer("azure", "eastus-1", "NC24ads", "A100", 1, 1.5, 3.67),  # 1.5 a GPU, cheapest on-demand
              _offer("gcp", "us-central1-a", "a2-8g", "A100", 8, 4.0, 29.39, stale=True),  # 0.5, but stale
              _offer("aws", "us-east-1a", "m7i.2xlarge", "", 0, 0.1, 0.4)]  # CPU-only: no row
    hazards = {("aws", "us-east-1a", "p4d.24xlarge"): Hazard(2, 86400.0)}
    [row] = gpu_rows(offers, hazards, NOW)
    assert row.gpu == "A100" and row.best is not None and row.best.zone == "us-east-1a"
    assert row.spot == pytest.approx(1.225) and row.on_demand == pytest.approx(3.67)
    assert row.saving == pytest.approx(1 - 1.225 / 3.67) and row.zones == 2 and row.age_s == 300
    assert row.hazard.per_day == pytest.approx(1.5)  # (2 + 1 prior) in (1 day + 1 prior day)


def test_a_type_with_on_demand_only_has_no_spot_and_no_saving() -> None:
    [row] = gpu_rows([_offer("aws", "us-east-1a", "p5.48xlarge", "H100", 8, None, 98.3)], {}, NOW)
    assert row.best is None and row.spot is None and row.saving is None and row.on_demand == pytest.approx(12.2875)
    assert row.hazard is NO_RUNS and NO_RUNS.text() == "no runs yet (prior: 1/day)"


def test_filter_defaults_and_links_keep_the_other_choices() -> None:
    where = MarketFilter.parse({"cloud": "gcp", "sort": "saving", "order": "desc", "page": "3"})
    assert (where.cloud, where.sort, where.desc, where.page) == ("gcp", "saving", True, 3)
    assert where.link(page=4) == "/market?cloud=gcp&sort=saving&order=desc&page=4"
    assert MarketFilter.parse({}).link() == "/market"


@pytest.mark.parametrize(("params", "field"), [({"sort": "cost"}, "sort"), ({"order": "down"}, "order"),
                                               ({"page": "-1"}, "page"), ({"page": "1e9"}, "page"),
                                               ({"page": "9999999"}, "page"), ({"gpu": "x" * 101}, "gpu"),
                                               ({"region": "a\x00b"}, "region"), ({"cloud": "\ud800"}, "cloud"),
                                               ({"kind": "tpu"}, "kind")])
def test_hostile_filters_are_one_error_naming_the_field(params: dict[str, str], field: str) -> None:
    with pytest.raises(MarketQueryError, match=f"^{field}: "):
        MarketFilter.parse(params)
