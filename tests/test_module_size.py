"""Every module of ``broker/`` stays small enough to read in one sitting: at most 400 lines."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MAX_LINES = 400


def test_no_broker_module_is_over_400_lines() -> None:
    sizes = {path.relative_to(ROOT).as_posix(): len(path.read_text(encoding="utf-8").splitlines())
             for path in (ROOT / "broker").rglob("*.py")}
    assert len(sizes) > 50  # the walk found the package
    assert {name: n for name, n in sizes.items() if n > MAX_LINES} == {}
