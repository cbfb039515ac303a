"""The one progress figure: the job's report first, then the estimate from its run time, and which it is."""

from __future__ import annotations

import math
from datetime import UTC, datetime, timedelta

import pytest

from broker.status.progress import ESTIMATED, FINISHED, REPORTED, UNKNOWN, estimate, job_progress

T0 = datetime(2026, 3, 1, tzinfo=UTC)


def test_a_report_with_a_total_wins_over_the_estimate() -> None:
    # The estimate would say 88 % (the run time against broker.work); the job said step 1141 of 3000.
    spans = [(T0, T0 + timedelta(minutes=1), None)]
    figure = job_progress("RUNNING", (1141, 3000), 3600.0, 0.0, spans, T0 + timedelta(minutes=1, seconds=3168))
    assert figure.source == REPORTED and figure.share == pytest.approx(1141 / 3000)
    assert figure.text() == "1141/3000 (38%, reported)"
    assert estimate(3600.0, 0.0, spans, T0 + timedelta(minutes=1, seconds=3168)) == pytest.approx(0.88)


def test_a_report_without_a_total_is_a_step_and_no_share() -> None:
    figure = job_progress("RUNNING", (200, None), 3600.0, 0.0, [], T0)
    assert figure.share is None and figure.text() == "step 200 (reported)"
    assert job_progress("RUNNING", (5, 0), None, 0.0, [], T0).text() == "step 5 (reported)"


def test_without_a_report_the_estimate_counts_running_time_of_every_attempt_less_the_work_lost() -> None:
    spans = [(T0, T0 + timedelta(minutes=5), T0 + timedelta(minutes=65)),  # 60 min run, then preempted
             (T0 + timedelta(minutes=70), T0 + timedelta(minutes=75), None)]  # running since minute 75
    now = T0 + timedelta(minutes=105)  # 30 min more
    figure = job_progress("RUNNING", None, 4 * 3600.0, 15 * 60.0, spans, now)
    assert figure.source == ESTIMATED and figure.share == pytest.approx((90 - 15) / 240)
    assert figure.text() == "31% (estimated from run time)"
    assert figure.finish == now + timedelta(minutes=240 - 75)


def test_the_estimate_is_bounded_and_a_clock_behind_the_allocations_counts_nothing() -> None:
    spans = [(T0, T0, None)]
    assert estimate(60.0, 0.0, spans, T0 + timedelta(days=3)) == 1.0
    assert estimate(60.0, 0.0, spans, T0 - timedelta(hours=1)) == 0.0  # a wall clock read against market times
    assert estimate(60.0, 10_000.0, spans, T0 + timedelta(seconds=30)) == 0.0


@pytest.mark.parametrize("work", [None, 0.0, -5.0])
def test_no_work_estimate_and_no_report_is_unknown(work: float | None) -> None:
    figure = job_progress("RUNNING", None, work, 0.0, [(T0, T0, None)], T0 + timedelta(hours=1))
    assert figure.source == UNKNOWN and figure.share is None and figure.text() == "-"


def test_a_succeeded_job_is_finished_whatever_it_last_reported() -> None:
    figure = job_progress("SUCCEEDED", (10, 3000), 3600.0, 0.0, [], T0)
    assert figure.source == FINISHED and figure.share == 1.0 and figure.text() == "100% (finished)"


def test_a_hostile_report_stays_a_share_between_0_and_1() -> None:
    assert job_progress("RUNNING", (5000, 3000), None, 0.0, [], T0).share == 1.0
    assert job_progress("RUNNING", (-7, 3000), None, 0.0, [], T0).share == 0.0
    share = job_progress("RUNNING", (2**62, 2**63 - 1), None, 0.0, [], T0).share
    assert share is not None and math.isfinite(share) and 0.0 <= share <= 1.0
