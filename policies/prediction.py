"""When will a job finish? A prediction with an interval, from the best evidence there is.

``predict(request: PredictionRequest) -> Prediction | None`` is pure. In order of preference:

1. **Progress** (the job reports ``step`` of ``total``): the seconds per step between successive
   reports, taken from the latest attempt once it is past its warm-up (the first reports of every
   attempt hold start-up, data loading and compilation, and a restart's restore), pooled with earlier
   attempts when the latest has too few. The median gives the estimate; the interquartile range of
   the per-report rates gives the interval.
2. **Stated work** (``broker.work``): what is left of it after the time the job has already run.
3. **History**: the run times of earlier jobs with the same name and team. Jobs still running
   count too, as lower bounds (right-censored): leaving them out would teach the model that jobs
   are short, because at any moment the long ones are the ones not finished yet. The Kaplan-Meier
   survival curve of those run times, conditioned on the job having already run as long as it
   has, gives the median as the estimate and the 10th and 90th percentiles as the interval.

With none of these there is no prediction.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

WARMUP_REPORTS = 2  # per attempt, the first intervals are not representative
MIN_INTERVALS = 3
WORK_LOW, WORK_HIGH = 0.8, 1.25


@dataclass(frozen=True, slots=True)
class ProgressPoint:
    at_s: float  # seconds, on the market clock
    step: int
    attempt: int


@dataclass(frozen=True, slots=True)
class PredictionRequest:
    now_s: float
    total_steps: int | None = None
    progress: tuple[ProgressPoint, ...] = ()  # oldest first
    work_s: float | None = None
    ran_s: float = 0.0  # seconds the job has run so far, over all attempts
    history_s: tuple[float, ...] = ()  # run times of earlier finished jobs of the same name and team
    running_s: tuple[float, ...] = ()  # how long earlier jobs of the same name and team still running have run

    def __post_init__(self) -> None:
        for name in ("now_s", "ran_s"):
            if not math.isfinite(getattr(self, name)):
                raise ValueError(f"{name} must be finite")
        if self.work_s is not None and not (math.isfinite(self.work_s) and self.work_s >= 0):
            raise ValueError(f"work_s must be a finite number >= 0, got {self.work_s!r}")


@dataclass(frozen=True, slots=True)
class Prediction:
    remaining_s: float
    low_s: float
    high_s: float
    source: str  # "progress", "work" or "history"


def quantile(values: list[float], q: float) -> float:
    """Linear-interpolated quantile of a non-empty list (numpy's default method)."""
    ordered = sorted(values)
    position = q * (len(ordered) - 1)
    lower = math.floor(position)
    upper = min(lower + 1, len(ordered) - 1)
    return ordered[lower] + (ordered[upper] - ordered[lower]) * (position - lower)


def seconds_per_step(progress: tuple[ProgressPoint, ...]) -> list[float]:
    """Per-interval seconds per step, latest attempt first, warm-up intervals of each attempt left out."""
    by_attempt: dict[int, list[ProgressPoint]] = {}
    for point in progress:
        by_attempt.setdefault(point.attempt, []).append(point)
    rates: list[float] = []
    for attempt in sorted(by_attempt, reverse=True):
        points = by_attempt[attempt]
        intervals = [(b.at_s - a.at_s) / (b.step - a.step) for a, b in itertools.pairwise(points)
                     if b.step > a.step and b.at_s >= a.at_s]
        rates.extend(intervals[WARMUP_REPORTS:])
        if len(rates) >= MIN_INTERVALS:
            break
    return rates


def from_progress(request: PredictionRequest) -> Prediction | None:
    if not request.progress or not request.total_steps:
        return None
    rates = seconds_per_step(request.progress)
    if len(rates) < MIN_INTERVALS:
        return None
    last = request.progress[-1]
    steps_left = max(request.total_steps - last.step, 0)
    since_report = max(request.now_s - last.at_s, 0.0)

    def left(rate: float) -> float:
        return max(steps_left * rate - since_report, 0.0)

    return Prediction(left(quantile(rates, 0.5)), left(quantile(rates, 0.25)), left(quantile(rates, 0.75)),
                      "progress")


def from_work(request: PredictionRequest) -> Prediction | None:
    if request.work_s is None:
        return None
    left = max(request.work_s - request.ran_s, 0.0)
    return Prediction(left, left * WORK_LOW, left * WORK_HIGH, "work")


def survival_quantiles(finished: tuple[float, ...], censored: tuple[float, ...], after: float,
                       qs: tuple[float, ...]) -> list[float] | None:
    """Kaplan-Meier quantiles of run time given it exceeds ``after``; None when the data cannot say.

    A quantile the curve never reaches (too much censoring) is the longest time observed: a lower
    bound, which is the honest answer there.
    """
    observations = sorted([(d, True) for d in finished if math.isfinite(d) and d > after]
                          + [(c, False) for c in censored if math.isfinite(c) and c > after])
    if not any(event for _, event in observations):
        return None
    at_risk, survival = len(observations), 1.0
    curve: list[tuple[float, float]] = []  # (time, survival just after it)
    i = 0
    while i < len(observations):
        time, deaths, leaving = observations[i][0], 0, 0
        while i < len(observations) and observations[i][0] == time:
            deaths += observations[i][1]
            leaving += 1
            i += 1
        if deaths:
            survival *= 1 - deaths / at_risk
            curve.append((time, survival))
        at_risk -= leaving
    longest = observations[-1][0]
    return [next((t for t, left in curve if left <= 1 - q + 1e-12), longest) for q in qs]


def from_history(request: PredictionRequest) -> Prediction | None:
    found = survival_quantiles(request.history_s, request.running_s, request.ran_s, (0.5, 0.1, 0.9))
    if found is None:
        return None
    median, low, high = (q - request.ran_s for q in found)
    return Prediction(median, low, high, "history")


def predict(request: PredictionRequest) -> Prediction | None:
    for source in (from_progress, from_work, from_history):
        found = source(request)
        if found is not None:
            return found
    return None
