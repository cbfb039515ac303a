"""Output into pipes and files: whole tables in the same columns, JSON on request, no colour when asked."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from broker.clock import WallClock
from broker.engine.machine import submit_job
from broker.spec.job import parse_job_spec
from broker.store import open_store

ROOT = Path(__file__).resolve().parents[3]
LONG_NAME = "a-job-name-long-enough-to-be-cut-in-any-eighty-column-terminal-" + "x" * 40


def _broker(home: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    environment = {**os.environ, "BROKER_HOME": str(home), "COLUMNS": "40", **env}
    environment.pop("BROKER_SERVER", None)
    return subprocess.run([sys.executable, "-m", "broker", *args], cwd=ROOT, env=environment, capture_output=True,
                          text=True, timeout=120)


def _jobs(home: Path, count: int) -> list[str]:
    store = open_store(f"sqlite:///{home / 'broker.db'}")
    try:
        spec = parse_job_spec(f"name: {LONG_NAME}\nresources:\n  accelerators: V100:1\nrun: echo hi\n", offline=True)
        return [submit_job(store, WallClock(), spec, home, "local") for _ in range(count)]
    finally:
        store.dispose()


def test_status_into_a_pipe_prints_whole_ids_names_and_prices(tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    ids = _jobs(home, 3)
    result = _broker(home, "status")
    assert result.returncode == 0, result.stderr
    assert "…" not in result.stdout and "..." not in result.stdout
    lines = result.stdout.splitlines()
    header = next(ln for ln in lines if "job" in ln and "state" in ln)
    for name in ("job", "name", "team", "state", "where", "preemptions", "migrations", "cost", "on-demand"):
        assert name in header
    for job_id in ids:
        row = next(ln for ln in lines if job_id in ln)  # the whole id, on one line with its name and prices
        assert LONG_NAME in row and "PENDING" in row and row.count("$0.0000") == 2
    # The same columns for every row: each row has the job id where the header has "job".
    assert len({ln.index("j-") for ln in lines if "j-" in ln}) == 1


def test_status_json_and_no_color(tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    ids = _jobs(home, 2)
    listed = json.loads(_broker(home, "status", "--json").stdout)
    assert [item["job_id"] for item in listed] == ids and listed[0]["name"] == LONG_NAME
    forced = {"FORCE_COLOR": "1", "TTY_COMPATIBLE": "1", "COLUMNS": "200"}  # a wide forced terminal
    coloured = _broker(home, "status", **forced)
    assert "\x1b[" in coloured.stdout  # a forced terminal gets styles ...
    for plain in (_broker(home, "--no-color", "status", **forced), _broker(home, "status", NO_COLOR="1", **forced)):
        assert plain.returncode == 0, plain.stderr
        assert "\x1b[" not in plain.stdout and ids[0] in plain.stdout  # ... unless colour is turned off


def test_unknown_job_is_one_line_on_stderr_and_exit_2(tmp_path: Path) -> None:
    result = _broker(tmp_path / "home", "status", "j-\u2028;--" + "9" * 5000)
    assert result.returncode == 2
    assert result.stdout == "" and len(result.stderr.strip().splitlines()) == 1 and "Traceback" not in result.stderr


def test_markup_and_terminal_escapes_in_stored_names_are_printed_inert(tmp_path: Path) -> None:
    """A name of "[/x] hi" made `broker status` raise MarkupError for the whole team; ESC and CR reached
    the terminal raw."""
    home = tmp_path / "home"
    home.mkdir()
    store = open_store(f"sqlite:///{home / 'broker.db'}")
    try:
        for name in ("[/x] hi", "a\\nb\\rc\\x1b[31mred"):
            spec = parse_job_spec(f'name: "{name}"\nresources:\n  accelerators: V100:1\nrun: echo hi\n', offline=True)
            submit_job(store, WallClock(), spec, home, "local")
    finally:
        store.dispose()
    result = _broker(home, "status", COLUMNS="200")
    assert result.returncode == 0, result.stderr
    assert "[/x] hi" in result.stdout
    assert "\x1b" not in result.stdout and "\r" not in result.stdout
    assert "\\x1b[31mred" in result.stdout
