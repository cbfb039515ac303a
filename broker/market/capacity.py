"""Every cloud's capacity signal on one scale: whether a spot launch is likely to succeed.

AWS gives a placement score (1-10), GCP an obtainability (0-1), Azure a placement level (High,
Medium, Low). The market and the selection policy read them as one score on AWS's scale, so that a
zone of any cloud is judged by the same threshold, ``LIKELY_SCORE``:

- AWS: its own score;
- GCP: ``1 + 9 * obtainability`` (0 -> 1, 1/3 -> 4, 1 -> 10);
- Azure: Low -> 2, Medium -> 5, High -> 8.

Below ``LIKELY_SCORE`` a zone is seen with no spot capacity; on-demand stays offered.
"""

from __future__ import annotations

from typing import Any

LIKELY_SCORE = 4.0  # on AWS's 1-10 scale; GCP's obtainability 1/3 and Azure's Medium are at or above it
PLACEMENT_LEVEL_SCORES: dict[str, float] = {"Low": 2.0, "Medium": 5.0, "High": 8.0}


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
