"""The provisioning waste's advice: a zone is called slower only when it clearly was, in words that show it."""

from __future__ import annotations

import pytest

from broker.reports.sums import ZoneProvisioning
from broker.reports.waste import _Describer, minutes, slower


def _advice(*zones: tuple[str, int, float]) -> list[str]:
    rows = [ZoneProvisioning(zone, clusters, up, up * 8, up * 0.1) for zone, clusters, up in zones]
    return [w.suggestion for w in _Describer({}, {}, {}).provisioning(rows)]


def test_three_minutes_against_three_minutes_is_no_slower_zone() -> None:
    # 3.2 min against 2.9: both read "3 min" in whole minutes, and 18 s is under the bar.
    first, second = _advice(("aws/us-east-1a", 1, 3.2), ("gcp/us-central1-a", 1, 2.9))
    assert "elsewhere" not in first and "1 launch(es) took 3 min 12 s each" in first
    assert "elsewhere" not in second
    # 3.4 against 2.6 is worth saying, and says it in seconds (not "3 min vs 3 min").
    slow, _ = _advice(("aws/us-east-1a", 1, 3.4), ("gcp/us-central1-a", 1, 2.6))
    assert "took 3 min 24 s to come up vs 2 min 36 s elsewhere" in slow


def test_a_clearly_slower_zone_is_named_with_both_times() -> None:
    slow, _fast = _advice(("aws/us-east-1a", 2, 2 * 9.0), ("gcp/us-central1-a", 2, 2 * 2.5))
    assert "clusters there took 9 min 00 s to come up vs 2 min 30 s elsewhere" in slow


@pytest.mark.parametrize(("value", "shown"), [(0.25, "15 s"), (3.4, "3 min 24 s"), (9.99, "9 min 59 s"),
                                              (10.0, "10 min"), (42.4, "42 min")])
def test_minutes_text(value: float, shown: str) -> None:
    assert minutes(value) == shown


def test_slower_needs_a_fifth_more_and_half_a_minute() -> None:
    assert not slower(3.2, 2.9) and slower(3.4, 2.6) is True  # 0.3 min; 0.8 min and 31 %
    assert not slower(20.5, 20.0) and slower(25.0, 20.0) and not slower(1.0, 2.0)
