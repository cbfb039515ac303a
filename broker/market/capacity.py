"""Every cloud's capacity signal on one scale: whether a spot launch is likely to succeed.

AWS gives a placement score (1-10), GCP an obtainability (0-1), Azure a placement level (High,
Medium, Low). The market and the selection policy read them as one score on AWS's scale, so that a
zone of any cloud is judged by the same threshold, ``LIKELY_SCORE``:

- AWS: its own score;
- GCP: ``1 + 9 * obtainability`` (0 -> 1, 1/3 -> 4, 1 -> 10);
- Azure: Low -> 2, Medium -> 5, High -> 8.

Below ``LIKELY_SCORE`` a zone is seen with no spot capacity; on-demand stays offered.

``prior_uptime_s`` is the other use of the signals: how long a spot VM there is expected to run
before the cloud takes it, the prior of the zone's preemption hazard (``policies.checkpointing``'s
``blended_hazard``, the selection policy's expected run where the broker's own record is thin):

- GCP's ``estimatedUptime`` (``advice.capacity``) as it is;
- else GCP's daily preemption rate ``p`` (``advice.capacityHistory``, the share of the day's
  stopped Spot VMs that were preempted): ``DEFAULT_PRIOR_UPTIME_S / p``, one preemption per day
  of running scaled by how many stops were the cloud's, with ``p`` taken as at least
  ``MIN_PREEMPTION_RATE`` (a day with none preempted is no promise of forever);
- else nothing (AWS and Azure publish no uptime): the one-per-day default applies.
"""

from __future__ import annotations

import math
from typing import Any

from policies.checkpointing import DEFAULT_PRIOR_UPTIME_S

LIKELY_SCORE = 4.0  # on AWS's 1-10 scale; GCP's obtainability 1/3 and Azure's Medium are at or above it
PLACEMENT_LEVEL_SCORES: dict[str, float] = {"Low": 2.0, "Medium": 5.0, "High": 8.0}
MIN_PREEMPTION_RATE = 1 / 30  # a preemption rate of 0 reads as this: at most 30 days of expected uptime
MIN_UPTIME_S = 60.0


def capacity_score_of(quote: Any) -> float | None:
    """The quote's (or price-book row's) capacity signal on the 1-10 scale; None where its cloud said nothing."""
    if quote.capacity_score is not None:
        return float(quote.capacity_score)
    if getattr(quote, "obtainability", None) is not None:
        return 1.0 + 9.0 * float(quote.obtainability)
    level = getattr(quote, "placement_level", None)
    return PLACEMENT_LEVEL_SCORES.get(level) if level is not None else None


def capacity_unlikely(quote: Any) -> bool:
    """The cloud's own signal says a spot launch there is unlikely to succeed now."""
    score = capacity_score_of(quote)
    return score is not None and score < LIKELY_SCORE


def prior_uptime_s(quote: Any) -> float | None:
    """The cloud's own expectation of a spot VM's run before preemption, in seconds; None where it
    says nothing (see the module's docstring)."""
    return uptime_from(getattr(quote, "estimated_uptime_s", None), getattr(quote, "preemption_rate", None))


def uptime_from(estimated_uptime_s: float | None, preemption_rate: float | None) -> float | None:
    """``prior_uptime_s`` from the two signals themselves (None or NaN: not said)."""
    if estimated_uptime_s is not None and math.isfinite(estimated_uptime_s) and estimated_uptime_s > 0:
        return max(float(estimated_uptime_s), MIN_UPTIME_S)
    if preemption_rate is not None and 0 <= preemption_rate <= 1:  # NaN fails this
        return DEFAULT_PRIOR_UPTIME_S / max(float(preemption_rate), MIN_PREEMPTION_RATE)
    return None
