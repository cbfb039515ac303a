"""Clocks: the wall clock for real clouds, an accelerated one for the local backend's replay.

Everything the engine stores is in clock time. The accelerated clock maps wall time onto market
time at ``speed`` market seconds per wall second from a fixed origin, so a broker restarted in
the middle of a replay finds the market exactly where it left it.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Protocol


class Clock(Protocol):
    @property
    def speed(self) -> float: ...

    def now(self) -> datetime: ...

    def to_clock(self, wall_epoch: float) -> datetime: ...


class WallClock:
    speed = 1.0

    def now(self) -> datetime:
        return datetime.now(UTC)

    def to_clock(self, wall_epoch: float) -> datetime:
        return datetime.fromtimestamp(wall_epoch, UTC)


@dataclass(frozen=True)
class AcceleratedClock:
    """Clock time = ``origin + (wall - wall_origin) * speed``; origin is a real wall instant."""

    wall_origin: float  # epoch seconds
    speed: float

    @classmethod
    def starting_now(cls, speed: float) -> AcceleratedClock:
        return cls(time.time(), speed)

    @property
    def origin(self) -> datetime:
        return datetime.fromtimestamp(self.wall_origin, UTC)

    def now(self) -> datetime:
        return self.to_clock(time.time())

    def to_clock(self, wall_epoch: float) -> datetime:
        return self.origin + timedelta(seconds=(wall_epoch - self.wall_origin) * self.speed)

    def to_wall(self, when: datetime) -> float:
        return self.wall_origin + (when - self.origin).total_seconds() / self.speed
