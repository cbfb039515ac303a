"""Jobs that state a deadline but no work: the estimate, and the broker staying on spot without one."""

from __future__ import annotations

import math
from datetime import timedelta

import pytest

from broker.sim.market import Market, SimJob, simulate
from policies import kinds
from policies.history import MarketHistory, MarketSeries
from policies.selection import ON_DEMAND, JobView, SelectionRequest, ZoneOffer
from policies.work_estimate import HISTORY, STATED, UNKNOWN, estimate_work, from_progress
from tests.markets import START, make_trace

HOUR = 3600.0


def test_stated_work_wins_and_counts_down() -> None:
    found = estimate_work(10 * HOUR, 4 * HOUR, past_work_s=[99 * HOUR])
    assert (found.total_s, found.remaining_s, found.source) == (10 * HOUR, 6 * HOUR, STATED)


def test_history_of_the_name_gives_the_median_less_what_is_done() -> None:
    found = estimate_work(None, 1 * HOUR, past_work_s=[2 * HOUR, 8 * HOUR, 5 * HOUR])
    assert (found.total_s, found.remaining_s, found.source) == (5 * HOUR, 4 * HOUR, HISTORY)
    assert estimate_work(None, 0.0, past_work_s=[2 * HOUR, 4 * HOUR]).total_s == 3 * HOUR


@pytest.mark.parametrize("past", [[], [math.nan], [-1.0, 0.0], [math.inf], [1 * HOUR]])
def test_garbage_or_outrun_history_means_unknown(past: list[float]) -> None:
    found = estimate_work(None, 2 * HOUR, past_work_s=past)  # done 2 h: a 1 h history is outrun
    assert (found.total_s, found.remaining_s, found.source) == (None, None, UNKNOWN)
    assert "loose" in found.describe()


def test_progress_seam_needs_a_sane_report() -> None:
    assert from_progress(None, 100, HOUR) is None
    assert from_progress(0, 100, HOUR) is None
    assert from_progress(200, 100, HOUR) is None
    assert from_progress(25, 100, HOUR) == 4 * HOUR
    assert estimate_work(None, HOUR, progress_total_s=4 * HOUR, past_work_s=[9 * HOUR]).remaining_s == 3 * HOUR


CALM = ZoneOffer("aws", "us-east-1", "us-east-1a", "p3.2xlarge", "V100", 1, 0.9, 3.06, None)


@pytest.mark.parametrize("hours", [6, 48, 720, 400 * 24, 70 * 365 * 24])
def test_deadline_only_job_goes_to_spot_without_history(hours: int) -> None:
    broker = kinds.selection.get("broker")
    job = JobView(1, 1, "V100", None, START + timedelta(hours=hours))
    plan = broker(SelectionRequest(now=START, job=job, offers=(CALM,)))
    assert plan.locations[0].kind == "spot", plan.reason


def test_deadline_only_job_runs_on_spot_through_the_simulator() -> None:
    trace = make_trace([[1]] * 400)  # one zone, capacity all along: a calm market
    market = Market(trace, 1)
    tick = trace.tick_seconds
    hidden = SimJob(num_nodes=1, work_s=60 * tick, deadline_s=300 * tick, restart_overhead_s=2 * tick,
                    work_known=False)
    run = simulate(market, hidden, kinds.selection.get("broker"), 0)
    assert run.on_demand_hours == 0 and run.deadline_met
    assert run.spot_work_hours == pytest.approx(60 * tick / HOUR)
    # and the policy itself, asked at a later tick with the market's history, still says spot
    request = SelectionRequest(now=trace.time_of(50), job=JobView(1, 1, "V100", None, trace.time_of(300)),
                               offers=(CALM,), history=MarketHistory(MarketSeries.from_trace(trace), 50),
                               step_s=tick)
    assert kinds.selection.get("broker")(request).locations[0].kind != ON_DEMAND


def test_deadline_floor_still_holds_for_a_deadline_only_job() -> None:
    broker = kinds.selection.get("broker")
    job = JobView(1, 1, "V100", None, START + timedelta(minutes=20), restart_overhead_s=720.0)
    plan = broker(SelectionRequest(now=START, job=job, offers=(CALM,), step_s=300.0))
    assert plan.locations[0].kind == ON_DEMAND  # 4 steps left: below 2 restarts + 1
