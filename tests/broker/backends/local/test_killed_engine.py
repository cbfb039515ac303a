"""`kill -9` of the embedded engine while the quickstart runs, its preemption coming while no engine
runs: the next `broker engine` resumes from the newest checkpoint on disk and meters every minute."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import pytest
from sqlalchemy import select

from broker.agent.checkpoint import latest_checkpoint
from broker.store import open_store
from broker.store.tables import ClusterRow, JobEventRow, LedgerRow

ROOT = Path(__file__).resolve().parents[4]
T = TypeVar("T")


def _broker(home: Path, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "broker", *args], cwd=ROOT / "examples",
                          env={**os.environ, "BROKER_HOME": str(home)}, capture_output=True, text=True,
                          timeout=timeout)


def _wait(what: Callable[[], T], timeout: float = 180, seen: Callable[[], object] = lambda: None) -> T:
    """``what`` once true; past ``timeout``, an error with ``seen()`` (what the test was waiting on)."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        value = what()
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError(f"timed out after {timeout:.0f} s; saw {seen()!r}")


def _events(node: Path) -> list[str]:
    try:
        return [json.loads(line)["event"] for line in (node / "status.events").read_text().splitlines()]
    except (OSError, ValueError):
        return []


def _group_gone(node: Path) -> bool:
    try:
        os.killpg(int((node / "status.pgid").read_text()), 0)
    except ProcessLookupError:
        return True
    except (OSError, ValueError):
        return False
    return False


@pytest.mark.slow
@pytest.mark.timeout(900)  # its own waits (420 s for the notice, 600 s for the engine) are the bounds, not the default
def test_a_checkpoint_made_while_no_engine_ran_is_resumed_from(broker_home: Path) -> None:
    launched = _broker(broker_home, "launch", "quickstart.yaml", "--detach", "--json")
    assert launched.returncode == 0, launched.stderr
    job_id = str(json.loads(launched.stdout)["job_id"])
    node = broker_home / "local" / "clusters" / f"{job_id}-c1" / "runs" / f"{job_id}-1" / "node-0"
    _wait(lambda: "started" in _events(node))
    os.kill(int((broker_home / "engine.lock").read_text().split()[0]), signal.SIGKILL)

    # The market takes the first zone's nodes while no engine runs: the agents checkpoint on the
    # notice, find nobody to tell, and the nodes go.
    _wait(lambda: "acknowledged" in _events(node) and _group_gone(node), timeout=420,  # market time, slower loaded
          seen=lambda: {"events": _events(node), "group_gone": _group_gone(node)})
    assert "report_gave_up" in _events(node) and "checkpoint_complete" in _events(node)
    on_disk = latest_checkpoint(broker_home / "checkpoints" / job_id)  # the notice's, never reported
    assert on_disk is not None

    finished = _broker(broker_home, "engine", timeout=600)
    assert finished.returncode == 0, finished.stderr
    shown = json.loads(_broker(broker_home, "status", job_id, "--json").stdout)
    assert shown["state"] == "SUCCEEDED" and shown["progress"] == {"step": 400, "total": 400}

    store = open_store(f"sqlite:///{broker_home / 'broker.db'}")
    try:
        with store.transaction() as s:
            starts = [e.detail for e in s.scalars(select(JobEventRow).where(
                JobEventRow.job_id == job_id, JobEventRow.to_state == "RUNNING").order_by(JobEventRow.id))]
            assert starts[-1]["attempt"] == 2 and starts[-1]["resume_from"] == on_disk.path
            # Every second of every cluster is in the ledger once, the minutes of the gap included.
            for cluster in s.scalars(select(ClusterRow).where(ClusterRow.job_id == job_id)):
                assert cluster.terminated_at is not None and cluster.metered_until == cluster.terminated_at
                pieces: dict[object, float] = defaultdict(float)
                for row in s.scalars(select(LedgerRow).where(LedgerRow.cluster_id == cluster.id)):
                    pieces[row.minute] = max(pieces[row.minute], row.seconds)
                lived = (cluster.terminated_at - cluster.created_at).total_seconds()
                assert lived - 1e-3 <= sum(pieces.values()) <= max(lived, 60.0) + 1e-3, cluster.id
    finally:
        store.dispose()
