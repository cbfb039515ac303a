"""Processes a test session left running: the suite fails if any outlives it.

Every process the suite starts inherits ``SESSION_MARK`` from the pytest process, or names the
session's temporary root in its command line or environment (a test that builds a fresh
environment still points its broker home, cluster or log paths there). At the end of the session
each such process is given a moment to exit, then reported and killed.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from pathlib import Path

SESSION_MARK = "SPOT_BROKER_TEST_SESSION"


def _read(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except OSError:
        return b""


def session_processes(mark: str, temp_root: str, exclude: set[int]) -> dict[int, str]:
    """Live processes carrying ``mark`` in their environment or ``temp_root`` anywhere in it or their command."""
    found: dict[int, str] = {}
    needles = (f"{SESSION_MARK}={mark}".encode(), temp_root.encode())
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) in exclude:
            continue
        status = _read(entry / "stat")
        if b") Z " in status:  # a zombie is already gone; its parent just has not reaped it
            continue
        cmdline = _read(entry / "cmdline")
        if any(n in cmdline or n in _read(entry / "environ") for n in needles):
            found[int(entry.name)] = cmdline.replace(b"\0", b" ").decode(errors="replace").strip()[:200]
    return found


def reap_leftovers(mark: str, temp_root: str, grace_seconds: float = 10.0) -> dict[int, str]:
    """Wait up to ``grace_seconds`` for the session's processes to end; kill and return those that did not."""
    exclude = {os.getpid(), os.getppid()}
    deadline = time.monotonic() + grace_seconds
    left = session_processes(mark, temp_root, exclude)
    while left and time.monotonic() < deadline:
        time.sleep(0.2)
        left = session_processes(mark, temp_root, exclude)
    for pid in left:
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)
    return left
