"""The eager policy: reserve near a predicted finish; boot early only when the worst-case overlap is worth it."""

from __future__ import annotations

import math

import pytest

from policies import kinds
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
    assert kinds.eager.default_name() == "off"
    assert kinds.eager.get("eager") is eager


@pytest.mark.parametrize("bad", [-1.0, math.nan, math.inf])
def test_a_request_refuses_numbers_no_prediction_gives(bad: float) -> None:
    with pytest.raises(ValueError, match="remaining_s"):
        EagerRequest("reserve", bad, 0.0, 0.0, lead_s=1.0)


def _release(overrun: float, slip: float, remaining: float, high: float, elsewhere: float | None) -> EagerRequest:
    return EagerRequest("release", remaining, remaining, high, lead_s=120.0, overrun_s=overrun, slip_s=slip,
                        elsewhere_s=elsewhere)


def test_a_reservation_on_time_is_kept_whatever_else_is_free() -> None:
    decision = eager(_release(0.0, 0.0, 30.0, 40.0, elsewhere=0.0))
    assert not decision.act and "on time" in decision.reason


def test_a_slipped_finish_gives_the_reservation_up_when_elsewhere_is_sooner() -> None:
    # The current prediction (still holding) says 600 s more; a new cluster is up in 120 s.
    yes = eager(_release(0.0, 500.0, 600.0, 700.0, elsewhere=120.0))
    assert yes.act and "give the reservation up" in yes.reason and yes.idle_removed_s == 480.0
    # It now says 100 s more: a 120 s boot is no sooner.
    assert not eager(_release(0.0, 50.0, 100.0, 130.0, elsewhere=120.0)).act
    # Nowhere else to go (the pool is full of running jobs): the job keeps waiting.
    no = eager(_release(900.0, 0.0, 0.0, 0.0, elsewhere=None))
    assert not no.act and "nowhere else" in no.reason


def test_once_no_estimate_holds_the_overrun_so_far_is_the_expected_rest() -> None:
    # Every prediction has passed (the kept ones keep saying "soon"): late by 90 s, taken as 90 s more.
    assert not eager(_release(90.0, 0.0, 0.0, 0.0, elsewhere=120.0)).act
    later = eager(_release(150.0, 0.0, 0.0, 0.0, elsewhere=120.0))
    assert later.act and "150 s past its predicted finish" in later.reason


def test_off_never_gives_a_reservation_up() -> None:
    assert not off(_release(1000.0, 1000.0, 0.0, 0.0, elsewhere=0.0)).act


@pytest.mark.parametrize("field", ["overrun_s", "slip_s", "elsewhere_s"])
@pytest.mark.parametrize("bad", [-1.0, math.nan, math.inf])
def test_a_release_request_refuses_numbers_no_clock_gives(field: str, bad: float) -> None:
    values: dict[str, float] = {"overrun_s": 1.0, "slip_s": 1.0, "elsewhere_s": 1.0, field: bad}
    with pytest.raises(ValueError, match=field):
        EagerRequest("release", 0.0, 0.0, 0.0, lead_s=1.0, **values)
