"""The end-of-session check finds a process a test left behind, and kills it."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from pathlib import Path

from tests.leftovers import SESSION_MARK, reap_leftovers, session_processes


def test_a_process_carrying_the_mark_or_the_temp_root_is_found_and_killed(tmp_path: Path) -> None:
    mark = uuid.uuid4().hex
    by_mark = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"],
                               env={**os.environ, SESSION_MARK: mark})
    by_path = subprocess.Popen([sys.executable, "-c", f"import time; time.sleep(120)  # {tmp_path}"],
                               env={"PATH": os.environ["PATH"]})
    try:
        found = session_processes(mark, str(tmp_path), exclude={os.getpid()})
        assert {by_mark.pid, by_path.pid} <= set(found)
        left = reap_leftovers(mark, str(tmp_path), grace_seconds=0)
        assert {by_mark.pid, by_path.pid} <= set(left)
        assert by_mark.wait(timeout=30) != 0 and by_path.wait(timeout=30) != 0  # killed
    finally:
        by_mark.kill()
        by_path.kill()


def test_a_process_that_ends_within_the_grace_is_not_reported(tmp_path: Path) -> None:
    mark = uuid.uuid4().hex
    quick = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(0.3)"],
                             env={**os.environ, SESSION_MARK: mark})
    try:
        assert reap_leftovers(mark, str(tmp_path), grace_seconds=60) == {}
    finally:
        quick.kill()
        quick.wait()
