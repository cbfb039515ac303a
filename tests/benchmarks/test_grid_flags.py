"""The grid benchmark refuses garbage job-shape flags in one line, exit 2, before it runs a cell."""

from __future__ import annotations

import gzip
import subprocess
import sys
from pathlib import Path

import pytest

from tests.markets import trace_text

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "grid.py"


# No NUL: an exec's argument cannot hold one.
@pytest.mark.parametrize(("flag", "value"), [
    ("--work", "nan"), ("--work", "inf"), ("--work", "0"), ("--work", "-10"), ("--work", "1e308"),
    ("--work", "abc"), ("--work", "9" * 5000), ("--work", ""),
    ("--slack", "nan"), ("--slack", "0.5"), ("--slack", "101"), ("--slack", "x"), ("--slack", "-inf"),
])
def test_a_garbage_shape_is_refused_in_one_line(flag: str, value: str, tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, str(SCRIPT), "--traces", str(tmp_path), flag, value],
                          capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 2
    assert flag in done.stderr.strip().splitlines()[-1]
    assert "Traceback" not in done.stderr and done.stdout == ""


def test_the_shape_flags_choose_the_cells(tmp_path: Path) -> None:
    """On a two-zone trace of 40 h in five-minute ticks, ``--work 1 3 --slack 1.5`` runs exactly
    those two shapes for the one gang size the trace counts."""
    ticks = 40 * 12
    available = [[1 if (t // 30) % 3 else 0, 1 if (t // 45) % 2 else 0] for t in range(ticks)]
    text = trace_text(available, zones=(("us-east-1a", "us-east-1"), ("us-west-2a", "us-west-2")), tick_s=300)
    with gzip.open(tmp_path / "two-zones.csv.gz", "wt") as handle:
        handle.write(text)
    done = subprocess.run([sys.executable, str(SCRIPT), "--traces", str(tmp_path), "--no-optimum", "--starts", "2",
                           "--work", "1", "3", "--slack", "1.5"], capture_output=True, text=True, timeout=300,
                          check=False)
    assert done.returncode == 0, done.stderr
    rows = [line.split() for line in done.stdout.splitlines() if line.startswith("two-zones ")]
    cells = [row[1:4] for row in rows if len(row) > 4]  # the per-trace summary has four fields
    assert cells == [["1", "1", "1.5"], ["1", "3", "1.5"]]
