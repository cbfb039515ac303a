"""The fair-share benchmark refuses garbage flags in one line, exit 2, before it replays anything."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "fair_share.py"


@pytest.mark.parametrize(("flag", "value"), [
    ("--gpus", "0"), ("--gpus", "-4"), ("--gpus", "nan"), ("--gpus", "1e308"), ("--gpus", "9" * 5000),
    ("--seed", "-1"), ("--seed", "abc"), ("--traces", "/nonexistent"),
    ("--jobs", "0"), ("--jobs", "-3"), ("--jobs", "nan"), ("--jobs", "inf"), ("--jobs", "1.5"), ("--jobs", "9" * 5000),
])
def test_a_garbage_flag_is_refused_in_one_line(flag: str, value: str) -> None:
    done = subprocess.run([sys.executable, str(SCRIPT), flag, value], capture_output=True, text=True, timeout=60,
                          check=False)
    assert done.returncode == 2
    said = done.stderr.strip().splitlines()
    assert flag in said[-1] and "Traceback" not in done.stderr
