"""Finish-time prediction on hand-computed cases."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from policies.prediction import Prediction, PredictionRequest, ProgressPoint, predict, quantile


def _points(attempt: int, start_s: float, steps: list[int], seconds: list[float]) -> tuple[ProgressPoint, ...]:
    return tuple(ProgressPoint(start_s + t, s, attempt) for s, t in zip(steps, seconds, strict=True))


def test_steady_steps_after_a_slow_start() -> None:
    # Warm-up: 10 steps took 60 s, then 10 more took 30 s; then 1 s per step for 40 steps.
    points = _points(1, 0, [10, 20, 30, 40, 50, 60], [60, 90, 100, 110, 120, 130])
    found = predict(PredictionRequest(now_s=135, total_steps=100, progress=points))
    # The first interval is 3 s/step, then 1 s/step; the first two are warm-up. 40 steps left at
    # 1 s/step, 5 s of which have passed since the last report.
    assert found == Prediction(35.0, 35.0, 35.0, "progress")


def test_a_restart_is_not_mistaken_for_slow_steps() -> None:
    first = _points(1, 0, [0, 10, 20, 30, 40, 50], [0, 50, 60, 70, 80, 90])  # 1 s/step once warm
    # Attempt 2 resumes at step 40: restore took 100 s, then 2 s/step (a slower zone).
    second = _points(2, 200, [40, 41, 51, 61, 71, 81], [0, 100, 120, 140, 160, 180])
    found = predict(PredictionRequest(now_s=380, total_steps=181, progress=first + second))
    assert found is not None and found.source == "progress"
    assert found.remaining_s == pytest.approx(100 * 2.0)  # the latest attempt's rate, not the first's


def test_too_few_reports_fall_back_to_the_stated_work() -> None:
    found = predict(PredictionRequest(now_s=10, total_steps=100, progress=_points(1, 0, [1, 2], [1, 2]),
                                      work_s=3600, ran_s=600))
    assert found == Prediction(3000, 2400, 3750, "work")


def test_history_is_conditioned_on_how_long_the_job_has_run() -> None:
    history = (100.0, 200.0, 300.0, 400.0, 1000.0)
    fresh = predict(PredictionRequest(now_s=0, history_s=history))
    assert fresh is not None and fresh.remaining_s == 300 and fresh.source == "history"
    # Already ran 350 s: only the runs of 400 and 1000 s are like it. The survival curve is 0.5
    # after 400 s and 0 after 1000 s: median and 10th percentile 400 s, 90th 1000 s.
    late = predict(PredictionRequest(now_s=0, history_s=history, ran_s=350))
    assert late == Prediction(50, 50, 650, "history")


def test_jobs_still_running_count_as_lower_bounds() -> None:
    # Finished: 100 and 200 s. Still running: two jobs past 500 s. Kaplan-Meier: S = 3/4 after
    # 100 s, 1/2 after 200 s, and no event after: the median is 200 s, the 90th percentile is
    # unknown, answered by the longest time seen (a lower bound).
    found = predict(PredictionRequest(now_s=0, history_s=(100.0, 200.0), running_s=(500.0, 600.0)))
    assert found == Prediction(200, 100, 600, "history")
    # Leaving the running ones out halves the median (S = 1/2 after 100 s) and claims to know the tail.
    assert predict(PredictionRequest(now_s=0, history_s=(100.0, 200.0))) == Prediction(100, 100, 200, "history")


def test_nothing_known_means_no_prediction() -> None:
    assert predict(PredictionRequest(now_s=0)) is None
    assert predict(PredictionRequest(now_s=0, history_s=(10.0,), ran_s=20)) is None


def test_quantile_matches_numpys_default() -> None:
    import numpy as np

    values = [3.0, 1.0, 7.0, 4.0, 10.0, 2.5]
    for q in (0.0, 0.1, 0.25, 0.5, 0.9, 1.0):
        assert quantile(values, q) == pytest.approx(float(np.quantile(values, q)))


@pytest.mark.parametrize("bad", [{"now_s": math.nan}, {"now_s": 0, "work_s": -1}, {"now_s": 0, "ran_s": math.inf}])
def test_bad_requests_are_refused(bad: dict[str, float]) -> None:
    with pytest.raises(ValueError):
        PredictionRequest(**bad)


@given(steps=st.lists(st.integers(0, 10**9), min_size=1, max_size=30),
       gaps=st.lists(st.floats(0, 1e6), min_size=30, max_size=30), total=st.integers(1, 10**9))
def test_predictions_are_ordered_and_never_negative(steps: list[int], gaps: list[float], total: int) -> None:
    times = [sum(gaps[: i + 1]) for i in range(len(steps))]
    points = _points(1, 0, sorted(steps), times)
    found = predict(PredictionRequest(now_s=times[-1], total_steps=total, progress=points))
    assert found is None or 0 <= found.low_s <= found.remaining_s <= found.high_s
