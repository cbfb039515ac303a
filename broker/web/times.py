"""Times on the dashboard: wall-clock UTC always, the replayed market's time beside it where they differ.

Everything the engine stores is on the broker's clock (``broker.clock``): the wall clock on the
clouds, an accelerated one (60 market seconds a wall second by default) on the embedded default's
replay. A person reads the wall clock, so every time is shown as the wall-clock instant it happened
at, with the market's time beside it when the clock is accelerated; durations are market time (the
ledger bills market seconds), with the wall time they took beside them.
"""

from __future__ import annotations

from datetime import UTC, datetime

from broker.clock import AcceleratedClock, Clock
from broker.web.html import e


def wall_of(clock: Clock, at: datetime) -> datetime:
    """The wall-clock instant of a time stored on ``clock``."""
    if isinstance(clock, AcceleratedClock):
        return datetime.fromtimestamp(clock.to_wall(at), UTC)
    return at.astimezone(UTC)


def duration(seconds: float) -> str:
    """``45 s``, ``12 min``, ``3 h 05 min``, ``2 d 04 h``."""
    seconds = max(float(seconds), 0.0)
    if seconds < 90:
        return f"{seconds:.0f} s"
    minutes = int(seconds // 60)
    if minutes < 60:
        return f"{minutes} min"
    hours, minutes = divmod(minutes, 60)
    if hours < 48:
        return f"{hours} h {minutes:02d} min"
    days, hours = divmod(hours, 24)
    return f"{days} d {hours:02d} h"


class Times:
    """How one page shows the times of one broker's clock."""

    def __init__(self, clock: Clock) -> None:
        self.clock = clock
        self.speed = clock.speed if isinstance(clock, AcceleratedClock) else 1.0
        self.replay = isinstance(clock, AcceleratedClock) and clock.speed != 1.0

    def at(self, at: datetime | None, seconds: bool = False) -> str:
        """HTML: the wall-clock time (UTC), and the market's beside it on a replay."""
        if at is None:
            return "-"
        pattern = "%Y-%m-%d %H:%M:%S" if seconds else "%Y-%m-%d %H:%M"
        wall = wall_of(self.clock, at)
        shown = f'<time datetime="{wall.isoformat()}">{wall.strftime(pattern)}</time>'
        if not self.replay:
            return shown
        return f'{shown} <span class="market-time" title="market clock">(market {at.strftime(pattern)})</span>'

    def plain(self, at: datetime, seconds: bool = False) -> str:
        """Text (an SVG label, a title): the wall-clock time, ``market ...`` beside it on a replay."""
        pattern = "%Y-%m-%d %H:%M:%S" if seconds else "%Y-%m-%d %H:%M"
        wall = wall_of(self.clock, at).strftime(pattern)
        return f"{wall} UTC (market {at.strftime(pattern)})" if self.replay else f"{wall} UTC"

    def span(self, seconds: float) -> str:
        """A duration in market time, with the wall time it took beside it on a replay."""
        if not self.replay:
            return duration(seconds)
        return f"{duration(seconds)} ({duration(seconds / self.speed)} wall)"

    def note(self) -> str:
        """The line a page with times carries, saying which clock they are on."""
        if not self.replay:
            return '<p class="clock-note">Times are wall-clock UTC.</p>'
        return (f'<p class="clock-note">Times are wall-clock UTC; this broker replays a recorded market '
                f'{e(f"{self.speed:g}")}× faster, so the market clock (what the ledger bills, and durations) '
                f'is shown beside them.</p>')
