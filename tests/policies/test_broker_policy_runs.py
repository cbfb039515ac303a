"""What ``broker`` reads from partial spot counts: outages with part of the gang obtainable."""

from __future__ import annotations

from datetime import timedelta

from policies.broker_policy_runs import MIN_RUNS, capacity_wait, partial_outage_survival
from policies.history import MarketHistory, MarketSeries
from policies.selection import Budget, JobView, Location, SelectionRequest, ZoneOffer
from providers.trace import MarketTrace
from tests.markets import START, make_trace

GANG = 4
MINUTE = 60.0


def series_of(counts: list[int]) -> MarketSeries:
    return MarketSeries.from_trace(make_trace([[c] for c in counts]))


def request(trace: MarketTrace, tick: int, available: int) -> SelectionRequest:
    """A 4-node job, idle at ``tick``, whose one zone now offers ``available`` nodes."""
    quote = trace.quotes_at(tick)[0]
    offer = ZoneOffer(quote.cloud, quote.region, quote.zone, quote.instance_type, quote.accelerator, 1,
                      1.0, 3.0, available)
    return SelectionRequest(
        now=trace.time_of(tick),
        job=JobView(num_nodes=GANG, gpus_per_node=1, accelerator="V100", remaining_work_s=50 * MINUTE,
                    deadline=START + timedelta(minutes=tick + 80), restart_overhead_s=MINUTE,
                    total_work_s=50 * MINUTE, started_at=START),
        offers=(offer,), current=Location("idle"), record={},
        history=MarketHistory(MarketSeries.from_trace(trace), tick), step_s=MINUTE)


# 25 outages with half the gang obtainable, each over after one step, and 25 with nothing
# obtainable, each lasting five steps
MIXED = [GANG, GANG, 2] * 25 + [GANG, GANG, 0, 0, 0, 0, 0] * 25


def test_partial_outages_are_counted_from_those_ended_by_now_only() -> None:
    series = series_of([*MIXED, 2, 2, 2, 2])  # the last outage, partly obtainable, has not ended
    now = len(MIXED) + 3
    survival = partial_outage_survival(MarketHistory(series, now), GANG, 0, window=now, horizon=4)
    # every partial step seen so far was followed by capacity the next step
    assert survival.tolist() == [1.0, 0.0, 0.0, 0.0]
    # too few such steps in a short window: nothing to say
    assert partial_outage_survival(MarketHistory(series, now), GANG, 0, window=MIN_RUNS, horizon=4).size == 0
    # the same market cut at now gives the same answer (nothing from the future)
    cut = series_of([*MIXED, 2, 2, 2, 2][: now + 1])
    again = partial_outage_survival(MarketHistory(cut, now), GANG, 0, window=now, horizon=4)
    assert again.tolist() == survival.tolist()


def test_a_partly_obtainable_zone_is_expected_back_sooner() -> None:
    trace = make_trace([[c] for c in [*MIXED, 0]])
    now = len(MIXED)
    budget_of = Budget.of(request(trace, now, 0))
    nothing = capacity_wait(request(trace, now, 0), budget_of, horizon=10)
    partly = capacity_wait(request(trace, now, 2), budget_of, horizon=10)
    assert partly == 1.0  # the partial outages all ended the next step
    assert nothing > 2.0  # the zone's outages by age mix in the five-step ones

