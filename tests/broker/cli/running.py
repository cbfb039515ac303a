"""The CLI run in process, as the tests of its commands drive it."""

from __future__ import annotations

import pytest

from broker.cli import main


def run_cli(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    """``broker ARGV``: its exit code, stdout and stderr."""
    try:
        main(argv)
        code = 0
    except SystemExit as exc:
        code = int(exc.code or 0)
    out, err = capsys.readouterr()
    return code, out, err
