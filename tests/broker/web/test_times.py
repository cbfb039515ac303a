"""Times on the dashboard: the wall clock first, the replayed market's beside it; durations in both."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from broker.clock import AcceleratedClock, WallClock
from broker.web.times import Times, duration, wall_of

ORIGIN = datetime(2026, 11, 27, 7, 0, tzinfo=UTC)


def test_a_market_time_on_a_60x_replay_is_shown_at_the_wall_instant_it_happened() -> None:
    clock = AcceleratedClock(ORIGIN.timestamp(), 60.0)
    market = ORIGIN + timedelta(hours=18, minutes=9)  # 18 h 9 min of market = 18 min 9 s of wall
    assert wall_of(clock, market) == ORIGIN + timedelta(minutes=18, seconds=9)
    html = Times(clock).at(market)
    assert html.startswith('<time datetime="2026-11-27T07:18:09+00:00">2026-11-27 07:18</time>')
    assert "(market 2026-11-28 01:09)" in html
    assert Times(clock).plain(market) == "2026-11-27 07:18 UTC (market 2026-11-28 01:09)"


def test_on_the_wall_clock_one_time_is_shown_and_no_market_time() -> None:
    at = datetime(2026, 11, 27, 7, 0, 5, tzinfo=UTC)
    times = Times(WallClock())
    assert times.at(at, seconds=True) == '<time datetime="2026-11-27T07:00:05+00:00">2026-11-27 07:00:05</time>'
    assert "market" not in times.at(at) and times.plain(at) == "2026-11-27 07:00 UTC"
    assert times.at(None) == "-"
    # A replay at speed 1 is the wall clock too: nothing to set beside it.
    assert "market" not in Times(AcceleratedClock(ORIGIN.timestamp(), 1.0)).at(ORIGIN)


def test_durations_are_market_time_with_the_wall_time_beside_them_on_a_replay() -> None:
    assert Times(WallClock()).span(3 * 3600 + 5 * 60) == "3 h 05 min"
    assert Times(AcceleratedClock(ORIGIN.timestamp(), 60.0)).span(3 * 3600) == "3 h 00 min (3 min wall)"


@pytest.mark.parametrize(("seconds", "shown"), [(-4, "0 s"), (0, "0 s"), (89, "89 s"), (90, "1 min"),
                                                (3599, "59 min"), (3600, "1 h 00 min"), (47 * 3600, "47 h 00 min"),
                                                (49 * 3600, "2 d 01 h")])
def test_duration_text(seconds: float, shown: str) -> None:
    assert duration(seconds) == shown


def test_the_note_says_which_clock_and_how_fast() -> None:
    assert "60× faster" in Times(AcceleratedClock(ORIGIN.timestamp(), 60.0)).note()
    assert "60" not in Times(WallClock()).note()
