"""The eager policy: reserve near a predicted finish; boot early only when the worst-case overlap is worth it."""

from __future__ import annotations

import math

import pytest

from policies import registry
from policies.eager import EagerRequest, eager, off


def test_reserve_only_within_the_lead() -> None:
    assert not eager(EagerRequest("reserve", 300.0, 250.0, 360.0, lead_s=120.0)).act
    decision = eager(EagerRequest("reserve", 100.0, 80.0, 130.0, lead_s=120.0))
    assert decision.act and "100 s (80-130 s)" in decision.reason


def test_boot_weighs_the_worst_case_overlap_against_the_wait_removed() -> None:
    # Up in 120 s, finish predicted in 110 s, at worst 200 s: 80 s of overlap against 110 s of wait removed.
    yes = eager(EagerRequest("boot", 110.0, 90.0, 200.0, lead_s=60.0, boot_s=120.0, price_per_hour=36.0))
    assert yes.act and yes.early_cost == pytest.approx(36.0 * 80 / 3600) and yes.idle_removed_s == 110.0
    # A wide interval (at worst 400 s): 280 s of overlap is worth more than the 110 s removed.
    no = eager(EagerRequest("boot", 110.0, 90.0, 400.0, lead_s=60.0, boot_s=120.0, price_per_hour=36.0))
    assert not no.act and "more than the 110 s of wait" in no.reason
    # Too far ahead to boot at all.
    assert not eager(EagerRequest("boot", 1000.0, 900.0, 1100.0, lead_s=60.0, boot_s=120.0)).act


def test_off_never_acts_and_is_the_default() -> None:
    assert not off(EagerRequest("reserve", 0.0, 0.0, 0.0, lead_s=120.0)).act
    assert registry.default_name("eager") == "off"
    assert registry.get("eager", "eager") is eager


@pytest.mark.parametrize("bad", [-1.0, math.nan, math.inf])
def test_a_request_refuses_numbers_no_prediction_gives(bad: float) -> None:
    with pytest.raises(ValueError, match="remaining_s"):
        EagerRequest("reserve", bad, 0.0, 0.0, lead_s=1.0)
