from __future__ import annotations

from datetime import UTC, datetime

import pytest

from broker.market.capacity import (
    LIKELY_SCORE,
    MIN_UPTIME_S,
    capacity_score_of,
    capacity_unlikely,
    prior_uptime_s,
)
from policies.checkpointing import DEFAULT_PRIOR_UPTIME_S
from providers.base import SpotQuote

T0 = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)


def _quote(cloud: str, **signals: object) -> SpotQuote:
    return SpotQuote(cloud, "r", "z", "t", "H100", 8, 20.0, 88.0, T0, **signals)  # type: ignore[arg-type]


@pytest.mark.parametrize(("quote", "score", "unlikely"), [
    (_quote("aws", capacity_score=9.0), 9.0, False),
    (_quote("aws", capacity_score=3.0), 3.0, True),
    (_quote("gcp", obtainability=1.0, estimated_uptime_s=7200.0), 10.0, False),
    (_quote("gcp", obtainability=1 / 3), LIKELY_SCORE, False),  # the threshold itself is still likely
    (_quote("gcp", obtainability=0.1), 1.9, True),
    (_quote("gcp", obtainability=0.0), 1.0, True),
    (_quote("azure", placement_level="High"), 8.0, False),
    (_quote("azure", placement_level="Medium"), 5.0, False),
    (_quote("azure", placement_level="Low"), 2.0, True),
    (_quote("gcp", estimated_uptime_s=60.0), None, False),  # uptime alone says nothing about obtaining
    (_quote("azure"), None, False),
])
def test_every_clouds_signal_on_one_scale(quote: SpotQuote, score: float | None, unlikely: bool) -> None:
    assert capacity_score_of(quote) == (None if score is None else pytest.approx(score))
    assert capacity_unlikely(quote) is unlikely


@pytest.mark.parametrize(("quote", "uptime"), [
    (_quote("gcp", estimated_uptime_s=7200.0), 7200.0),
    (_quote("gcp", estimated_uptime_s=7200.0, preemption_rate=0.9), 7200.0),  # the uptime is the direct word
    (_quote("gcp", preemption_rate=0.5), DEFAULT_PRIOR_UPTIME_S / 0.5),
    (_quote("gcp", preemption_rate=0.0), DEFAULT_PRIOR_UPTIME_S * 30),  # no preemption yesterday: 30 days
    (_quote("gcp", estimated_uptime_s=1.0), MIN_UPTIME_S),
    (_quote("gcp", estimated_uptime_s=float("nan"), preemption_rate=1.0), DEFAULT_PRIOR_UPTIME_S),
    (_quote("gcp", estimated_uptime_s=0.0), None),
    (_quote("gcp", preemption_rate=1.5), None),  # out of range: not a word
    (_quote("gcp", preemption_rate=float("nan")), None),
    (_quote("aws", capacity_score=9.0), None),  # AWS and Azure state no uptime
    (_quote("azure", placement_level="High"), None),
])
def test_the_clouds_expected_uptime_as_the_hazards_prior(quote: SpotQuote, uptime: float | None) -> None:
    assert prior_uptime_s(quote) == (None if uptime is None else pytest.approx(uptime))
