"""The CLI in scripts: exit 0 when a pipe's reader closes it, ``-h``, ``--no-color`` after the command too,
``--backend`` on ``serve`` as on ``launch``, and a cancel of a finished job that says so and fails."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from broker.cli import hoist_global_flags
from tests.broker.cli.test_placement_cli import TINY

ROOT = Path(__file__).resolve().parents[3]


def _env(home: Path) -> dict[str, str]:
    env = {**os.environ, "BROKER_HOME": str(home)}
    env.pop("BROKER_SERVER", None)
    env.pop("BROKER_DB_URL", None)
    return env


def _closed_reader(home: Path, *args: str) -> tuple[int, str]:
    """Run ``broker ARGS`` with its stdout a pipe whose reader is already gone (``| head -0``)."""
    reader, writer = os.pipe()
    os.close(reader)
    try:
        done = subprocess.run([sys.executable, "-m", "broker", *args], cwd=ROOT, env=_env(home), stdout=writer,
                              stderr=subprocess.PIPE, text=True, timeout=300)
    finally:
        os.close(writer)
    return done.returncode, done.stderr


@pytest.mark.parametrize("args", [["show-topology", "p4d.24xlarge"], ["report", "--since", "30d"], ["status"],
                                  ["--help"], ["show-topology", "p4d.24xlarge", "--json"],
                                  ["simulate-placement", "--workload", "{tiny}", "--cluster", "2xp4d.24xlarge"]])
def test_a_closed_pipe_is_exit_0_and_says_nothing(tmp_path: Path, args: list[str]) -> None:
    tiny = tmp_path / "jobs.csv"
    tiny.write_text(TINY)
    code, err = _closed_reader(tmp_path, *[a.format(tiny=tiny) for a in args])
    assert (code, err) == (0, ""), err


def test_head_1_in_a_pipefail_shell_is_exit_0(tmp_path: Path) -> None:
    done = subprocess.run(["bash", "-c", f"set -o pipefail; {sys.executable} -m broker show-topology p5.48xlarge "
                                         "| head -1"], cwd=ROOT, env=_env(tmp_path), capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0 and len(done.stdout.splitlines()) == 1, done.stderr


@pytest.mark.parametrize("command", ["status", "launch", "serve", "report", "prices", "cancel"])
def test_h_is_help_on_every_command(tmp_path: Path, command: str) -> None:
    done = subprocess.run([sys.executable, "-m", "broker", command, "-h"], cwd=ROOT, env=_env(tmp_path),
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.startswith(f"Usage: broker {command}"), done.stderr


def test_no_color_after_the_command_is_accepted_and_means_no_escapes(tmp_path: Path) -> None:
    env = {**_env(tmp_path), "FORCE_COLOR": "1", "TTY_COMPATIBLE": "1", "COLUMNS": "200"}  # a forced terminal
    coloured = subprocess.run([sys.executable, "-m", "broker", "status"], cwd=ROOT, env=env, capture_output=True,
                              text=True, timeout=120)
    assert "\x1b[" in coloured.stdout  # styles, unless colour is turned off ...
    for argv in (["status", "--no-color"], ["--no-color", "status"]):
        done = subprocess.run([sys.executable, "-m", "broker", *argv], cwd=ROOT, env=env, capture_output=True,
                              text=True, timeout=120)
        assert done.returncode == 0 and "\x1b[" not in done.stdout and "job" in done.stdout, (argv, done.stderr)


@pytest.mark.parametrize(("argv", "hoisted"), [
    (["status", "--no-color"], ["--no-color", "status"]),
    (["status", "j-1", "--no-color", "--json"], ["--no-color", "status", "j-1", "--json"]),
    (["--no-color", "status", "--no-color"], ["--no-color", "status"]),
    (["logs", "--", "--no-color"], ["logs", "--", "--no-color"]),  # after `--` it is an argument
    (["status"], ["status"]), ([], [])])
def test_hoisting_global_flags(argv: list[str], hoisted: list[str]) -> None:
    assert hoist_global_flags(argv) == hoisted


@pytest.mark.parametrize("value", ["nope", "x" * 5000, "local\u2028", "\udcff"])
def test_serve_takes_backend_as_launch_does_and_refuses_others_in_one_line(tmp_path: Path, value: str) -> None:
    done = subprocess.run([sys.executable, "-m", "broker", "serve", "--backend", value], cwd=ROOT, env=_env(tmp_path),
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "--backend" in done.stderr and "Traceback" not in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1 and len(done.stderr) < 300


def test_serve_help_lists_backend(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, "-m", "broker", "serve", "--help"], cwd=ROOT, env=_env(tmp_path),
                          capture_output=True, text=True, timeout=120)
    assert "--backend" in done.stdout and "BROKER_BACKEND" in done.stdout


def test_cancel_of_a_finished_job_says_so_and_exits_1(tmp_path: Path) -> None:
    from datetime import UTC, datetime

    from broker.store import open_store
    from broker.store.tables import JobRow

    store = open_store(f"sqlite:///{tmp_path / 'broker.db'}")
    at = datetime(2026, 1, 1, tzinfo=UTC)
    try:
        with store.transaction() as s:
            s.add(JobRow(id="j-done", name="done", team="default", state="SUCCEEDED", priority=500, spec={},
                         backend="local", checkpoint_dir="/c", created_at=at, updated_at=at, finished_at=at, zones=[]))
    finally:
        store.dispose()
    done = subprocess.run([sys.executable, "-m", "broker", "cancel", "j-done"], cwd=ROOT, env=_env(tmp_path),
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 1 and done.stdout == ""
    assert "j-done had already ended (SUCCEEDED): nothing to cancel" in done.stderr
    missing = subprocess.run([sys.executable, "-m", "broker", "cancel", "j-nope"], cwd=ROOT, env=_env(tmp_path),
                             capture_output=True, text=True, timeout=120)
    assert missing.returncode == 2 and "no job 'j-nope'" in missing.stderr
