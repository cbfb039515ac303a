"""The eager benchmark refuses garbage flags in one line, exit 2, before it starts anything."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "eager.py"


# No NUL: an exec's argument cannot hold one.
@pytest.mark.parametrize("value", ["nan", "inf", "-1", "61", "1e308", "abc", "9" * 5000, ""])
def test_a_garbage_setup_seconds_is_refused_in_one_line(value: str) -> None:
    done = subprocess.run([sys.executable, str(SCRIPT), "--setup-seconds", value], capture_output=True, text=True,
                          timeout=60, check=False)
    assert done.returncode == 2
    said = done.stderr.strip().splitlines()
    assert "--setup-seconds" in said[-1] and "Traceback" not in done.stderr
