"""How much work a job has left when its job file does not say (``broker.work`` absent).

A deadline only means something against the work still to do. Most job files state a deadline and
no work; the rule, best source first:

1. the job's own progress, once it reports it (a step counter against its total steps): not
   reported by the agent yet; ``from_progress`` is the seam and says so by returning ``None``;
2. the work of the finished runs of jobs with the same name and team (their median), less the
   work this job has done;
3. otherwise unknown: the selection policies then treat the deadline as loose (spot, as with no
   deadline) and the deadline floor (``slack >= 2 x overhead + 1``, counted as if one step of
   work were left) still brings the job to on-demand when the deadline itself comes near.

An estimate a job has outrun (it has done more work than its name's history said) is no longer
evidence: the job is back to "unknown" rather than to "one step left".
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

STATED = "stated"
PROGRESS = "progress"
HISTORY = "history"
UNKNOWN = "unknown"

MAX_PAST_RUNS = 20  # the latest finished runs of the same name and team that count


@dataclass(frozen=True, slots=True)
class WorkEstimate:
    """The whole job's work and what is left, in seconds (``None``: unknown), and where they come from."""

    total_s: float | None
    remaining_s: float | None
    source: str

    def describe(self) -> str:
        if self.remaining_s is None:
            return "unknown (deadline treated as loose)"
        return f"{self.remaining_s / 3600:.1f} h left ({self.source})"


def from_progress(done_steps: int | None, total_steps: int | None, done_s: float) -> float | None:
    """Total work from the job's own progress report. Seam: the agent reports no progress yet."""
    if done_steps is None or total_steps is None or done_steps <= 0 or total_steps < done_steps:
        return None
    return done_s * total_steps / done_steps


def estimate_work(stated_s: float | None, done_s: float, past_work_s: Sequence[float] = (),
                  progress_total_s: float | None = None) -> WorkEstimate:
    """The job's work: stated, else from its progress, else from its name's history, else unknown.

    ``done_s`` is the work it has done and kept; ``past_work_s`` the work of finished runs of jobs
    with its name and team, latest first (non-finite or non-positive values are ignored)."""
    done_s = max(done_s, 0.0) if math.isfinite(done_s) else 0.0
    if stated_s is not None:
        return WorkEstimate(stated_s, max(stated_s - done_s, 0.0), STATED)
    if progress_total_s is not None and math.isfinite(progress_total_s) and progress_total_s > done_s:
        return WorkEstimate(progress_total_s, progress_total_s - done_s, PROGRESS)
    past = sorted(w for w in past_work_s[:MAX_PAST_RUNS] if math.isfinite(w) and w > 0)
    if past:
        middle = len(past) // 2
        median = past[middle] if len(past) % 2 else (past[middle - 1] + past[middle]) / 2
        if median > done_s:
            return WorkEstimate(median, median - done_s, HISTORY)
    return WorkEstimate(None, None, UNKNOWN)
