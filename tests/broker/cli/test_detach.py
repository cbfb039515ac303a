"""A detached launch leaves an engine running; status follows it, cancel stops it and its clusters."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[3]


def _broker(home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "BROKER_HOME": str(home)}
    return subprocess.run([sys.executable, "-m", "broker", *args], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=120)


def _status(home: Path, job_id: str) -> dict[str, Any]:
    result = _broker(home, "status", job_id, "--json")
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)  # type: ignore[no-any-return]


def _wait(home: Path, job_id: str, states: set[str], timeout: float = 90) -> dict[str, Any]:
    deadline = time.time() + timeout
    while time.time() < deadline:
        status = _status(home, job_id)
        if status["state"] in states:
            return status
        time.sleep(0.5)
    raise AssertionError(f"{job_id} never reached {states}")


@pytest.mark.slow
def test_detach_status_logs_cancel(broker_home: Path) -> None:
    previous = subprocess.Popen([sys.executable, "-c", "pass"])  # a previous engine, long gone
    previous.wait()
    broker_home.mkdir(mode=0o700, parents=True, exist_ok=True)
    (broker_home / "engine.lock").write_text(f"{previous.pid}\n")
    launched = _broker(broker_home, "launch", "examples/quickstart.yaml", "--detach", "--json")
    assert launched.returncode == 0, launched.stderr
    job_id = json.loads(launched.stdout)["job_id"]
    # The lock names the engine just started, from the moment launch returns: never the dead one.
    holder = int((broker_home / "engine.lock").read_text().split()[0])
    assert holder != previous.pid
    os.kill(holder, 0)  # alive: the pid to signal to stop it
    running = _wait(broker_home, job_id, {"RUNNING"})
    assert running["zone"] and running["price_per_hour"] > 0
    time.sleep(1.0)
    logs = _broker(broker_home, "logs", job_id)
    assert logs.returncode == 0 and "starting fresh: rank 0 of 2" in logs.stdout

    cancelled = _broker(broker_home, "cancel", job_id)
    assert cancelled.returncode == 0 and "CANCELLED" in cancelled.stdout
    assert _status(broker_home, job_id)["state"] == "CANCELLED"
    deadline = time.time() + 30
    while time.time() < deadline:
        clusters = (broker_home / "local" / "clusters").glob("*/status.json")
        states = [json.loads(p.read_text())["state"] for p in clusters]
        if states and all(s in ("TERMINATED", "FAILED") for s in states):
            break
        time.sleep(0.5)
    else:
        raise AssertionError(f"clusters still alive after cancel: {states}")
    again = _broker(broker_home, "cancel", job_id)  # it already ended: said so, and not a success
    assert again.returncode == 1 and f"{job_id} had already ended (CANCELLED): nothing to cancel" in again.stderr
