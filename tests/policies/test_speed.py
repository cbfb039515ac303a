"""Choosing the GPU type by cost per unit of work: the table, stated speeds, the broker's choice."""

from __future__ import annotations

import math
from datetime import timedelta

import pytest

from policies import kinds
from policies.selection import JobView, Location, SelectionRequest, ZoneOffer
from policies.speed import DEFAULT_SPEED, rank_accelerators, relative_speed, speed_of
from tests.markets import START

A100 = ZoneOffer("aws", "us-east-1", "us-east-1a", "p4de.24xlarge", "A100-80GB", 8, 10.0, 30.0, 4)
H100 = ZoneOffer("aws", "us-west-2", "us-west-2a", "p5.48xlarge", "H100", 8, 18.0, 60.0, 4)


def test_speeds_stated_then_table_then_unknown() -> None:
    assert speed_of("h100", {"H100": 2.1}) == 2.1
    assert speed_of("H100") == DEFAULT_SPEED["H100"]
    assert speed_of("B300") == 1.0
    assert speed_of("H100", {"H100": math.nan}) == DEFAULT_SPEED["H100"]  # garbage stated: ignored
    assert relative_speed("H100", "A100-80GB", {"H100": 2.1, "A100-80GB": 1.0}) == 2.1
    # only one end stated: both from the table, not a stated number over a table one
    assert relative_speed("H100", "A100-80GB", {"H100": 9.0}) == DEFAULT_SPEED["H100"] / DEFAULT_SPEED["A100-80GB"]


def test_rank_is_by_price_over_speed_not_by_hourly_price() -> None:
    ranked = rank_accelerators([("A100-80GB", 12.0), ("A100-80GB", 10.0), ("H100", 18.0), ("H100", math.inf)],
                               "A100-80GB", {"H100": 2.1, "A100-80GB": 1.0})
    assert [(c.accelerator, round(c.per_work, 3)) for c in ranked] == [("H100", 8.571), ("A100-80GB", 10.0)]


@pytest.mark.parametrize(("speed", "zone"), [((("H100", 2.1), ("A100-80GB", 1.0)), "us-west-2a"),
                                             ((("H100", 1.5), ("A100-80GB", 1.0)), "us-east-1a")])
def test_broker_runs_where_a_unit_of_work_is_cheapest(speed: tuple[tuple[str, float], ...], zone: str) -> None:
    broker = kinds.selection.get("broker")
    job = JobView(2, 8, "A100-80GB", 10 * 3600.0, START + timedelta(hours=40), speed=speed,
                  total_work_s=10 * 3600.0, started_at=START)
    plan = broker(SelectionRequest(now=START, job=job, offers=(A100, H100), step_s=300.0))
    assert plan.locations[0].offer is not None and plan.locations[0].offer.zone == zone
    assert {loc.offer.accelerator for loc in plan.locations if loc.offer} == {plan.locations[0].offer.accelerator}


def test_broker_stays_on_its_type_unless_the_other_is_clearly_cheaper() -> None:
    broker = kinds.selection.get("broker")
    # on A100 at $10; H100 at $18 / 1.9 = $9.47 a unit of work: 5 % cheaper, less than a switch needs
    job = JobView(2, 8, "A100-80GB", 10 * 3600.0, START + timedelta(hours=40),
                  speed=(("H100", 1.9), ("A100-80GB", 1.0)), total_work_s=10 * 3600.0, started_at=START)
    request = SelectionRequest(now=START, job=job, offers=(A100, H100), current=Location("spot", A100),
                               step_s=300.0, in_location_s=3600.0)
    plan = broker(request)
    assert plan.locations[0].offer is not None and plan.locations[0].offer.accelerator == "A100-80GB"
