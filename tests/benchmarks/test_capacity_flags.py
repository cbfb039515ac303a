"""The capacity benchmarks refuse garbage flags in one line, exit 2, before they start anything."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


# No NUL: an exec's argument cannot hold one.
@pytest.mark.parametrize(("script", "flag", "value"), [
    *(("capacity_prior.py", "--starts", v) for v in ("0", "-5", "100001", "abc", "9" * 5000, "")),
    *(("capacity_prior.py", "--window-days", v) for v in ("nan", "inf", "0", "-1", "61", "1e308", "x")),
    *(("notices.py", "--notices", v) for v in ("0", "-1", "1001", "nan", "9" * 5000, "")),
])
def test_a_garbage_flag_is_refused_in_one_line(script: str, flag: str, value: str) -> None:
    done = subprocess.run([sys.executable, str(BENCHMARKS / script), flag, value], capture_output=True, text=True,
                          timeout=120, check=False)
    assert done.returncode == 2, done.stdout
    said = done.stderr.strip().splitlines()
    assert flag in said[-1] and "Traceback" not in done.stderr and done.stdout == ""


def test_capacity_prior_without_the_traces_says_so(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, str(BENCHMARKS / "capacity_prior.py"), "--traces", str(tmp_path / "no")],
                          capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode != 0 and "no such folder" in done.stderr and "Traceback" not in done.stderr
