"""A detached launch's engine that died is restarted by the next `broker status`; `broker engine`
drives the same jobs in the foreground, and Ctrl-C leaves them for the next engine."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from broker.cli.engine import engine_alive, revive_if
from broker.store import open_store
from broker.store.tables import JobRow

ROOT = Path(__file__).resolve().parents[3]
JOB = """\
name: small
resources:
  accelerators: V100:1
workdir: {workdir}
run: {gate}python train.py --steps {steps} --step-seconds 0.05 --checkpoint-every 20
"""


def _env(home: Path) -> dict[str, str]:
    return {**os.environ, "BROKER_HOME": str(home)}


def _broker(home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "broker", *args], cwd=ROOT, env=_env(home), capture_output=True,
                          text=True, timeout=120)


def _wait(what: Any, timeout: float = 120) -> Any:
    deadline = time.time() + timeout
    while time.time() < deadline:
        value = what()
        if value:
            return value
        time.sleep(0.3)
    raise AssertionError("timed out")


def _launch_and_kill_its_engine(home: Path, tmp_path: Path, steps: int, gate: Path | None = None) -> str:
    """Launch detached and kill the engine; a ``gate`` holds the job's run until that file exists."""
    job = tmp_path / f"job-{steps}.yaml"
    wait = f"while [ ! -e {gate} ]; do sleep 0.1; done; " if gate is not None else ""
    job.write_text(JOB.format(workdir=ROOT / "examples", steps=steps, gate=wait))
    launched = _broker(home, "launch", str(job), "--detach", "--json")
    assert launched.returncode == 0, launched.stderr
    job_id = str(json.loads(launched.stdout)["job_id"])
    _wait(lambda: engine_alive(home) and (home / "engine.lock").read_text().strip())
    pid = int((home / "engine.lock").read_text().split()[0])
    os.kill(pid, signal.SIGKILL)  # the background engine dies; nothing restarts it by itself
    _wait(lambda: not engine_alive(home))
    return job_id


def _state(home: Path, job_id: str) -> str:
    shown = _broker(home, "status", job_id, "--json")
    assert shown.returncode == 0, shown.stderr
    return str(json.loads(shown.stdout)["state"])


def _stored_state(home: Path, job_id: str) -> str:
    store = open_store(f"sqlite:///{home / 'broker.db'}")
    try:
        with store.transaction() as s:
            job = s.get(JobRow, job_id)
            assert job is not None
            return job.state
    finally:
        store.dispose()


@pytest.mark.slow
def test_status_restarts_a_dead_detached_engine_and_the_job_finishes(broker_home: Path, tmp_path: Path) -> None:
    job_id = _launch_and_kill_its_engine(broker_home, tmp_path, steps=60)
    shown = _broker(broker_home, "status", job_id, "--json")
    assert shown.returncode == 0, shown.stderr
    assert json.loads(shown.stdout)["state"] not in ("SUCCEEDED", "FAILED")  # stdout stays the JSON alone
    assert "no engine was running for 1 active job(s)" in shown.stderr and "broker engine" in shown.stderr
    assert _wait(lambda: _state(broker_home, job_id) in ("SUCCEEDED", "FAILED") and _state(broker_home, job_id)) \
        == "SUCCEEDED"
    again = _broker(broker_home, "status", job_id)
    assert "no engine was running" not in again.stderr


@pytest.mark.slow
def test_broker_engine_runs_in_the_foreground_and_ctrl_c_leaves_the_job_for_the_next(broker_home: Path,
                                                                                     tmp_path: Path) -> None:
    gate = tmp_path / "go"  # the job cannot finish before Ctrl-C, however slow the machine
    job_id = _launch_and_kill_its_engine(broker_home, tmp_path, steps=40, gate=gate)
    engine = subprocess.Popen([sys.executable, "-m", "broker", "engine"], cwd=ROOT, env=_env(broker_home),
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        _wait(lambda: _stored_state(broker_home, job_id) == "RUNNING")
        busy = _broker(broker_home, "engine")  # a second one finds the first and leaves
        assert busy.returncode == 0 and f"an engine already drives {broker_home} (pid {engine.pid})" in busy.stderr
        engine.send_signal(signal.SIGINT)
        _, err = engine.communicate(timeout=180)  # a loaded machine: what the step under way takes to end
    finally:
        if engine.poll() is None:
            engine.kill()
    assert engine.returncode == 130, err
    # How far the killed engine had taken the job depends on the machine's speed; the foreground
    # engine took it from there to RUNNING (waited for above).
    assert "engine: driving 1 active job(s)" in err
    assert "engine stopped: 1 job(s) still active" in err and "Traceback" not in err
    assert _stored_state(broker_home, job_id) == "RUNNING"  # left as it was (`status` would restart an engine)

    gate.touch()
    finished = subprocess.run([sys.executable, "-m", "broker", "engine"], cwd=ROOT, env=_env(broker_home),
                              capture_output=True, text=True, timeout=300)
    assert finished.returncode == 0, finished.stderr
    assert "RUNNING -> SUCCEEDED" in finished.stderr and "engine: no active job left; stopped" in finished.stderr
    assert _state(broker_home, job_id) == "SUCCEEDED"


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    stat = Path(f"/proc/{pid}/stat")
    return stat.exists() and stat.read_text().rsplit(")", 1)[1].split()[0] == "Z"


def test_an_engine_just_restarted_counts_as_running_until_it_takes_the_lock(broker_home: Path) -> None:
    """`broker status` restarted the engine and `broker logs --follow` came before the new engine had
    taken the lock: it found none and started a second."""
    revive_if(None, 1, 0)  # what `broker status` does, finding an active job and no engine
    first = int((broker_home / "engine.lock").read_text().split()[0])
    assert engine_alive(broker_home)  # the new engine's Python is still starting: the lock is free
    revive_if(None, 1, 0)  # what `broker logs --follow` does right after
    assert int((broker_home / "engine.lock").read_text().split()[0]) == first  # no second engine
    # With no job in the store, the engine stops at once: then nothing counts as running.
    _wait(lambda: _gone(first), timeout=300)
    assert not engine_alive(broker_home)
