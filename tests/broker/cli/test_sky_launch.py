"""The SkyPilot launch's settings (the job judged by the price book: tests/broker/test_intake.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from broker.config.settings import ConfigError, load_settings

JOB = "name: g\nnum_nodes: 2\nresources:\n  accelerators: MI355X:8\nrun: python train.py\n"


@pytest.mark.parametrize(("name", "value", "field"), [
    ("price_max_age_seconds", "-1", "price_max_age_seconds"),
    ("price_max_age_seconds", "1e400", "price_max_age_seconds"),
    ("price_stale_seconds", "soon", "price_stale_seconds"),
    ("skypilot_sdk", "os:system; rm -rf /", "skypilot_sdk"),
    ("skypilot_sdk", "a\x00b:c", "skypilot_sdk"),
    ("skypilot_sdk", "m" * 5000 + ":x", "skypilot_sdk"),
])
def test_bad_settings_are_refused_naming_the_field(broker_home: Path, name: str, value: str, field: str) -> None:
    with pytest.raises(ConfigError, match=field):
        load_settings(**{name: value})
