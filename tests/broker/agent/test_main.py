"""The agent's command line: hostile durations are refused in one line, and the notice is read on
its own short interval, not only when the job's progress is (``--poll``)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.broker.agent.test_node import wait_until_ready
from tests.cloud_metadata import FakeGce, gce_server

JOB = """
import os, signal, sys, time
from pathlib import Path
d = Path(os.environ["BROKER_CHECKPOINT_DIR"])
signal.signal(signal.SIGUSR1, lambda *_: sys.exit(7))
(d / "ready").write_text("")
time.sleep(120)
"""


@pytest.mark.parametrize("flag", ["--poll", "--notice-poll"])
@pytest.mark.parametrize("value", ["nan", "inf", "-1s", "0", "2h", "soon", "9" * 5000, "1e400ms"])
def test_a_garbage_duration_is_refused_in_one_line(flag: str, value: str) -> None:
    done = subprocess.run([sys.executable, "-m", "broker.agent", flag, value, "--", "true"],
                          capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 2 and "Traceback" not in done.stderr
    last = done.stderr.strip().splitlines()[-1]
    assert flag in last and len(last) < 400


def test_a_notice_reaches_the_job_while_progress_is_read_only_once_an_hour(tmp_path: Path) -> None:
    """With ``--poll 3600s`` the agent would not read the notice within the job's two minutes if the
    notice waited for the progress poll; it is read every 50 ms (GCP's default) instead."""
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    job = tmp_path / "job.py"
    job.write_text(JOB)
    status = tmp_path / "status"
    state = FakeGce()
    with gce_server(state) as metadata:
        process = subprocess.Popen(
            [sys.executable, "-m", "broker.agent", "--cloud", "gcp", "--metadata-url", metadata, "--poll", "3600s",
             "--checkpoint-dir", str(ckpt), "--status-file", str(status), "--", sys.executable, str(job)],
            env={**os.environ, "BROKER_CHECKPOINT_DIR": str(ckpt)})
        try:
            wait_until_ready(ckpt)
            state.set("preempted", "TRUE")
            code = process.wait(timeout=100)
        finally:
            if process.poll() is None:
                process.kill()
                process.wait()
    assert code == 7  # the job's handler ran: it exits 7 on the checkpoint signal
    events = [json.loads(line)["event"] for line in Path(str(status) + ".events").read_text().splitlines()]
    assert events.index("notice_seen") < events.index("signaled")
