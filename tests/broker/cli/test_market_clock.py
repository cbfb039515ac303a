"""Each launch on the bundled market starts its own market clock, so the quickstart reproduces."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]


def _launch(home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "BROKER_HOME": str(home)}
    for name in ("BROKER_SERVER", "BROKER_MARKET", "BROKER_MARKET_CLOCK"):
        env.pop(name, None)
    return subprocess.run([sys.executable, "-m", "broker", "launch", *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=600)


@pytest.mark.slow
@pytest.mark.timeout(1300)
def test_two_quickstarts_in_a_row_in_one_home_both_meet_the_preemption(broker_home: Path) -> None:
    for attempt in (1, 2):
        result = _launch(broker_home, "examples/quickstart.yaml", "--json")
        assert result.returncode == 0, (attempt, result.stderr[-3000:])
        summary = json.loads(result.stdout.strip().splitlines()[-1])
        assert summary["state"] == "SUCCEEDED", summary
        assert summary["preemptions"] >= 1 and summary["migrations"] >= 1, (attempt, summary)
        assert summary["zones"][:2] == ["us-east-1a", "us-central1-a"], (attempt, summary["zones"])


@pytest.mark.parametrize("value", ["", "private", "own\x00", "x" * 10_000])
def test_a_market_clock_that_is_neither_own_nor_shared_is_refused(tmp_path: Path, value: str) -> None:
    if "\x00" in value:
        value = value.replace("\x00", "")  # a NUL cannot reach argv; the rest of the value still must be refused
        value += "-"
    result = _launch(tmp_path / "home", "examples/quickstart.yaml", "--market-clock", value)
    assert result.returncode == 2
    assert result.stderr.strip().splitlines()[-1].startswith("error: --market-clock: expected own or shared")
    assert len(result.stderr) < 400 and not (tmp_path / "home" / "broker.db").exists()
