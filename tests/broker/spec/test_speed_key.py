"""``broker.speed``: relative training speed per accelerator, and hostile values of it."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import pytest

from broker.spec.job import SpecError, parse_job_spec

NOW = datetime(2030, 6, 1, 12, tzinfo=UTC)
HEAD = "run: x\nresources:\n  any_of:\n    - accelerators: A100-80GB:8\n    - accelerators: H100:8\nbroker:\n"


def parse(speed: str):  # type: ignore[no-untyped-def]
    return parse_job_spec(HEAD + f"  speed: {speed}\n", source="job.yaml", now=NOW, offline=True)


def test_stated_speeds_are_kept_with_the_catalogs_spelling() -> None:
    spec = parse("{h100: 2.1, A100-80GB: 1}")
    assert spec.broker.speed == (("H100", 2.1), ("A100-80GB", 1.0))
    assert parse_job_spec(HEAD.removesuffix("broker:\n"), source="job.yaml", now=NOW, offline=True).broker.speed == ()


@pytest.mark.parametrize(("speed", "fragments"), [
    ("{Q9000: 3}", ["unknown accelerator 'Q9000'", "H100"]),
    ("{H100: -1}", ["H100: expected a relative speed", "> 0", "-1"]),
    ("{H100: 0}", ["> 0", "got 0"]),
    ("{H100: .nan}", ["finite number", "nan"]),
    ("{H100: .inf}", ["finite number", "inf"]),
    ("{H100: 1e300}", ["<= 1000"]),
    ("{H100: fast}", ["relative speed", "'fast'"]),
    ("{H100: true}", ["relative speed", "True"]),
    ("[H100, 2]", ["expected a mapping of accelerator to relative training speed"]),
    ("fast", ["expected a mapping", "'fast'"]),
    ("{H100: {deep: {deeper: [1]}}}", ["relative speed"]),
    ("{1: 2}", ["unknown accelerator '1'"]),
    ("{\"H1\\0\": 2}", ["NUL character"]),
    ("{" + ", ".join(f"G{i}: 1" for i in range(200)) + "}", ["200 entries"]),
    ("{? " + "X" * 100_000 + " : 1}", ["unknown accelerator"]),
])
def test_hostile_speed_is_refused_naming_the_field(speed: str, fragments: list[str], broker_home: Path) -> None:
    with pytest.raises(SpecError) as caught:
        parse(speed)
    error = caught.value
    assert error.field is not None and error.field.startswith("broker.speed")
    message = str(error)
    assert len(message) < 600  # the huge key is cut, not echoed
    for fragment in fragments:
        assert fragment in message
    assert not broker_home.exists()
