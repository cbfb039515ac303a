"""Whether a job's process group catches the checkpoint signal, read from /proc of real processes."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from broker.agent.catching import group_catches, may_send, terminates_by_default

pytestmark = pytest.mark.skipif(not Path("/proc/self/status").is_file(), reason="needs Linux /proc")

HANDLER = """
import signal, sys
from pathlib import Path
signal.signal(signal.SIGUSR1, lambda *_: None)
Path(sys.argv[1]).write_text("")
signal.pause()
"""


@contextlib.contextmanager
def group(command: list[str], ready: Path | None = None) -> Iterator[int]:
    """A process in its own group (as the agent starts a job); killed with its group afterwards."""
    process = subprocess.Popen(command, start_new_session=True)
    try:
        until = time.time() + 30
        while ready is not None and not ready.exists() and time.time() < until:
            time.sleep(0.05)
        yield process.pid
    finally:
        process.kill()
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait(timeout=30)


def test_a_process_without_a_handler_is_not_sent_a_deadly_signal() -> None:
    with group(["sleep", "60"]) as pgid:
        assert group_catches(pgid, signal.SIGUSR1) is False
        assert not may_send(pgid, signal.SIGUSR1)
        # A signal whose default action does no harm goes as it is.
        assert may_send(pgid, signal.SIGWINCH)


def test_a_handler_anywhere_in_the_group_counts(tmp_path: Path) -> None:
    script = tmp_path / "handler.py"
    script.write_text(HANDLER)
    ready = tmp_path / "ready"
    # The shell stays as the parent (two commands), with the default action; its child catches.
    with group(["bash", "-c", f"{sys.executable} {script} {ready}; true"], ready) as pgid:
        assert group_catches(pgid, signal.SIGUSR1) is True
        assert may_send(pgid, signal.SIGUSR1)
        assert group_catches(pgid, signal.SIGUSR2) is False


def test_an_ignored_signal_is_not_caught() -> None:
    # The wrapper shell's ``trap ''``: the signal is ignored, inherited so by what it starts, and lost.
    with group(["bash", "-c", "trap '' USR1; sleep 60; true"]) as pgid:
        until = time.time() + 30
        while not ignores(pgid, signal.SIGUSR1) and time.time() < until:
            time.sleep(0.05)
        assert ignores(pgid, signal.SIGUSR1)
        assert group_catches(pgid, signal.SIGUSR1) is False


def ignores(pid: int, signum: signal.Signals) -> bool:
    try:
        lines = Path(f"/proc/{pid}/status").read_text().splitlines()
    except OSError:
        return False
    mask = next(int(line.split()[1], 16) for line in lines if line.startswith("SigIgn:"))
    return bool(mask & (1 << (signum - 1)))


def test_a_group_with_no_process_keeps_the_old_behaviour() -> None:
    finished = subprocess.Popen(["true"], start_new_session=True)
    finished.wait(timeout=30)
    assert group_catches(finished.pid, signal.SIGUSR1) is None
    assert may_send(finished.pid, signal.SIGUSR1)


def test_which_signals_terminate_by_default() -> None:
    assert terminates_by_default(signal.SIGUSR1) and terminates_by_default(signal.SIGTERM)
    assert not terminates_by_default(signal.SIGCHLD) and not terminates_by_default(signal.SIGCONT)


@pytest.mark.parametrize(("content", "arg"), [
    (b"garbage", "SIGUSR1"), (b"12\x0034", "SIGUSR1"), (b"9" * 100_000, "SIGUSR1"), (b"-5", "SIGUSR1"),
    (b"1", "SIGUSR1"), (b"", "SIGUSR1"), (b"\xed\xa0\x80", "SIGUSR1"), (b"12345", "SIGNOPE"), (b"12345", "\udc80"),
])
def test_the_command_refuses_hostile_input_in_one_line(tmp_path: Path, content: bytes, arg: str) -> None:
    pgid_file = tmp_path / "pgid"
    pgid_file.write_bytes(content)
    done = subprocess.run([sys.executable, "-m", "broker.agent.catching", str(pgid_file), arg],
                          capture_output=True, timeout=60)
    assert done.returncode == 2
    lines = done.stderr.decode(errors="replace").strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in lines[0]
    assert "process group id" in lines[0] or "signal name" in lines[0]


def test_the_command_refuses_a_missing_file(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, "-m", "broker.agent.catching", str(tmp_path / "none"), "SIGUSR1"],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "expected a process group id" in done.stderr
