"""The checkpoint interval rule, on hand-computed cases."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from policies import kinds
from policies.checkpointing import (
    DEFAULT_PRIOR_UPTIME_S,
    CheckpointRequest,
    blended_hazard,
    daly_interval,
    expected_waste_fraction,
    fixed_interval,
    notice_only,
    young_daly,
)

HOUR = 3600.0


def test_a_checkpoint_that_fits_the_notice_needs_periodic_ones_only_for_unannounced_preemptions() -> None:
    # AWS: 120 s notice, 10 s checkpoint, one preemption every 2 h, none unannounced.
    request = CheckpointRequest(hazard_per_s=1 / (2 * HOUR), checkpoint_s=10, notice_s=120, unannounced_fraction=0)
    assert request.notice_fits
    assert young_daly(request).interval_s is None


def test_a_checkpoint_too_big_for_the_notice_gets_dalys_interval() -> None:
    # GCP: 30 s notice, a 50 GB checkpoint at 500 MB/s = 100 s, a preemption every 2 h (M = 7200 s).
    request = CheckpointRequest(hazard_per_s=1 / (2 * HOUR), checkpoint_s=100, notice_s=30)
    assert not request.notice_fits
    # By hand: sqrt(2*100*7200) = 1200; * (1 + sqrt(100/14400)/3 + 100/129600) = 1200 * 1.028549 = 1234.26;
    # minus 100 = 1134.26 s of work between checkpoints.
    plan = young_daly(request)
    assert plan.interval_s == pytest.approx(1134.26, abs=0.05)
    assert "does not fit a 30 s notice" in plan.reason
    # Young's first-order rule sqrt(2 d M) is within a few percent of it.
    assert plan.interval_s == pytest.approx(math.sqrt(2 * 100 * 7200), rel=0.07)


def test_when_checkpoints_cost_more_than_half_the_mean_time_to_loss_it_checkpoints_every_mtbf() -> None:
    assert daly_interval(checkpoint_s=500, mean_time_to_loss_s=200) == 200


def test_unannounced_preemptions_are_covered_even_when_the_notice_fits() -> None:
    request = CheckpointRequest(hazard_per_s=1 / HOUR, checkpoint_s=10, notice_s=120, unannounced_fraction=0.05)
    # lam = 0.05 / 3600 -> M = 72000 s; sqrt(2*10*72000) = 1200; tiny correction; minus 10.
    assert young_daly(request).interval_s == pytest.approx(1200 * (1 + math.sqrt(10 / 144000) / 3 + 10 / 1296000) - 10)


def test_the_rule_beats_both_baselines_on_its_own_cost_model() -> None:
    for hazard in (1 / (0.5 * HOUR), 1 / (2 * HOUR), 1 / (12 * HOUR)):
        for checkpoint_s, notice_s in ((10, 120), (100, 30), (300, 120), (100, 120)):
            request = CheckpointRequest(hazard, checkpoint_s, notice_s)
            ours = expected_waste_fraction(request, young_daly(request).interval_s)
            for baseline in (notice_only, fixed_interval):
                assert ours <= expected_waste_fraction(request, baseline(request).interval_s) + 1e-12


def test_registered_with_the_rule_as_default() -> None:
    assert kinds.checkpointing.default_name() == "young_daly"
    assert set(kinds.checkpointing.names()) >= {"young_daly", "notice_only", "fixed_interval"}


@pytest.mark.parametrize("field", ["hazard_per_s", "checkpoint_s", "notice_s"])
@pytest.mark.parametrize("value", [-1.0, math.nan, math.inf])
def test_out_of_range_inputs_are_refused_naming_the_field(field: str, value: float) -> None:
    args = {"hazard_per_s": 1e-4, "checkpoint_s": 10.0, "notice_s": 30.0, field: value}
    with pytest.raises(ValueError, match=field):
        CheckpointRequest(**args)


@given(hazard=st.floats(0, 1), checkpoint=st.floats(0, 1e6), notice=st.floats(0, 1e4), share=st.floats(0, 1))
def test_any_valid_request_gets_a_positive_finite_interval_or_none(hazard: float, checkpoint: float, notice: float,
                                                                   share: float) -> None:
    plan = young_daly(CheckpointRequest(hazard, checkpoint, notice, share))
    assert plan.interval_s is None or (math.isfinite(plan.interval_s) and plan.interval_s >= 60)


def test_the_hazard_starts_from_the_clouds_uptime_and_moves_to_the_brokers_own_record() -> None:
    assert blended_hazard(0, 0.0) == pytest.approx(1 / DEFAULT_PRIOR_UPTIME_S)  # the cloud says nothing
    assert blended_hazard(0, 0.0, 2 * HOUR) == pytest.approx(1 / (2 * HOUR))  # the cloud's word alone
    # after one uptime's worth of running, the cloud's word and the broker's record weigh the same
    assert blended_hazard(4, 2 * HOUR, 2 * HOUR) == pytest.approx(5 / (4 * HOUR))
    # a long record of the broker's own outweighs it: 100 preemptions in 100 h
    assert blended_hazard(100, 100 * HOUR, 2 * HOUR) == pytest.approx(101 / (102 * HOUR))
    # a shorter expected uptime asks for checkpoints more often
    short = young_daly(CheckpointRequest(blended_hazard(0, 0.0, HOUR), 100.0, 30.0)).interval_s
    long = young_daly(CheckpointRequest(blended_hazard(0, 0.0, 24 * HOUR), 100.0, 30.0)).interval_s
    assert short is not None and long is not None and short < long


@pytest.mark.parametrize("uptime", [0.0, -5.0, math.nan, math.inf, -math.inf])
def test_an_unusable_uptime_falls_back_to_the_default_prior(uptime: float) -> None:
    assert blended_hazard(1, HOUR, uptime) == pytest.approx(2 / (HOUR + DEFAULT_PRIOR_UPTIME_S))


@pytest.mark.parametrize(("preemptions", "exposure"), [(-1, 0.0), (0, -1.0), (0, math.nan), (0, math.inf)])
def test_a_broken_record_is_refused(preemptions: int, exposure: float) -> None:
    with pytest.raises(ValueError, match="preemptions"):
        blended_hazard(preemptions, exposure)
