"""A job's progress: one figure for `broker status`, the Jobs list and the job page.

The job's own report (the last step its agent sent, of a known total) comes first; without one, an
estimate from the run time kept against the job file's ``broker.work`` (the allocations' running
time on the broker's clock, less the work lost); and the figure says which it is. Standard library
only: `broker status` imports this without SQLAlchemy.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta

REPORTED, ESTIMATED, FINISHED, UNKNOWN = "reported", "estimated", "finished", "unknown"
Span = tuple[datetime, datetime | None, datetime | None]  # an allocation's (started, running, ended)


@dataclass(frozen=True, slots=True)
class JobProgress:
    share: float | None  # 0 to 1; None when neither a report with a total nor an estimate exists
    source: str  # REPORTED, ESTIMATED, FINISHED or UNKNOWN
    step: int | None = None
    total: int | None = None
    finish: datetime | None = None  # at the estimate's pace, on the broker's clock (estimates only)

    def text(self) -> str:
        """What every view prints: ``1141/3000 (38%, reported)``, ``38% (estimated)``, ``step 200 (reported)``."""
        if self.source == FINISHED:
            return "100% (finished)"
        if self.source == REPORTED and self.total:
            return f"{self.step}/{self.total} ({_pct(self.share)}, reported)"
        if self.source == REPORTED:
            return f"step {self.step} (reported)"
        if self.source == ESTIMATED:
            return f"{_pct(self.share)} (estimated from run time)"
        return "-"

    def to_dict(self) -> dict[str, object]:
        return {"share": None if self.share is None else round(self.share, 4), "source": self.source,
                "text": self.text()}


def _pct(share: float | None) -> str:
    return "-" if share is None else f"{100 * share:.0f}%"


def estimate(work_s: float | None, work_lost_s: float, spans: Iterable[Span], now: datetime) -> float | None:
    """Share of ``work_s`` done and kept: running time of every attempt up to ``now``, less the work lost."""
    if not work_s or work_s <= 0:
        return None
    done = sum(max(((end or now) - (running or start)).total_seconds(), 0.0) for start, running, end in spans)
    return min(max(done - (work_lost_s or 0.0), 0.0), work_s) / work_s


def job_progress(state: str, reported: tuple[int, int | None] | None, work_s: float | None, work_lost_s: float,
                 spans: Iterable[Span], now: datetime) -> JobProgress:
    """The one progress figure of a job; ``now`` is on the broker's clock (the market's, on a replay)."""
    if state == "SUCCEEDED":
        return JobProgress(1.0, FINISHED)
    if reported is not None:
        step, total = reported
        if total and total > 0:
            return JobProgress(min(max(step / total, 0.0), 1.0), REPORTED, step, total)
        return JobProgress(None, REPORTED, step, None)
    share = estimate(work_s, work_lost_s, spans, now)
    if share is None:
        return JobProgress(None, UNKNOWN)
    finish = now + timedelta(seconds=(1 - share) * (work_s or 0.0)) if state == "RUNNING" else None
    return JobProgress(share, ESTIMATED, finish=finish)
