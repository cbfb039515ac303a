"""End to end on the local backend: a node's notice reaches the engine, which asks for the replacement
cluster within seconds, while the old nodes are still alive."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select

from broker.store import open_store
from broker.store.tables import ClusterRow, JobRow

ROOT = Path(__file__).resolve().parents[3]
BOUND_SECONDS = 5.0


def _status(home: Path, cluster_id: str) -> dict[str, Any]:
    try:
        data: dict[str, Any] = json.loads((home / "local" / "clusters" / cluster_id / "status.json").read_text())
    except (OSError, ValueError):
        return {}
    return data


def _wall(created_at: datetime, world: dict[str, float]) -> float:
    """A clock time of the local backend's replay back on the wall clock."""
    clock = created_at if created_at.tzinfo else created_at.replace(tzinfo=UTC)
    origin = datetime.fromtimestamp(world["wall_origin"], UTC)
    return world["wall_origin"] + (clock - origin).total_seconds() / world["speed"]


@pytest.mark.slow
def test_replacement_is_requested_within_seconds_of_the_notice(broker_home: Path) -> None:
    env = {**os.environ, "BROKER_HOME": str(broker_home)}
    launch = subprocess.Popen([sys.executable, "-m", "broker", "launch", "examples/quickstart.yaml", "--json"],
                              cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    store = None
    try:
        deadline = time.monotonic() + 120
        first: ClusterRow | None = None
        replacement: ClusterRow | None = None
        while time.monotonic() < deadline and replacement is None:
            time.sleep(0.2)
            if store is None:
                if not (broker_home / "broker.db").exists():
                    continue
                store = open_store(f"sqlite:///{broker_home / 'broker.db'}")
            with store.transaction() as s:
                rows = list(s.scalars(select(ClusterRow).order_by(ClusterRow.created_at)))
                s.expunge_all()
            # The preempted cluster is the one whose cloud posted a notice; its replacement is the
            # first cluster launched after it.
            noticed = [r for r in rows if "notice_wall" in _status(broker_home, r.id)]
            if noticed:
                first = noticed[0]
                later = [r for r in rows if r.created_at > first.created_at]
                replacement = later[0] if later else None
        assert first is not None and replacement is not None, "no replacement was requested"
        first_dir = broker_home / "local" / "clusters" / first.id
        notice_wall = _status(broker_home, first.id)["notice_wall"]
        world = json.loads((broker_home / "local" / "world.json").read_text())
        requested = _wall(replacement.created_at, world)
        print(f"replacement requested {requested - notice_wall:.2f}s after the notice appeared")
        assert 0 <= requested - notice_wall < BOUND_SECONDS, requested - notice_wall
        assert replacement.zone != first.zone
        # The agents on the old nodes heard it and reported it to the broker's API.
        reported: list[float] = []
        while not reported and time.time() < notice_wall + BOUND_SECONDS:
            time.sleep(0.1)
            events = [json.loads(line) for path in first_dir.glob("runs/*/node-*/status.events")
                      for line in path.read_text().splitlines() if line.strip()]
            reported = [e["wall"] for e in events if e["event"] == "reported" and e["status"] == 202]
        assert reported and min(reported) - notice_wall < BOUND_SECONDS
        print(f"first agent report accepted {min(reported) - notice_wall:.2f}s after the notice appeared")
        with store.transaction() as s:  # type: ignore[union-attr]
            job = s.scalars(select(JobRow)).one()
            job_id = job.id
        subprocess.run([sys.executable, "-m", "broker", "cancel", job_id], cwd=ROOT, env=env, check=True,
                       capture_output=True, timeout=60)
        launch.wait(timeout=120)
        # Every local cluster host has gone with its cluster (none outlives the test's directory).
        hosts_end = time.monotonic() + 60
        states: list[str] = []
        while time.monotonic() < hosts_end:
            states = [json.loads((d / "status.json").read_text()).get("state", "?")
                      for d in (broker_home / "local" / "clusters").iterdir() if (d / "status.json").exists()]
            if all(state in ("TERMINATED", "FAILED") for state in states):
                break
            time.sleep(0.2)
        assert all(state in ("TERMINATED", "FAILED") for state in states), states
    finally:
        if launch.poll() is None:
            launch.kill()
            launch.wait()
        for directory in (broker_home / "local" / "clusters").glob("*"):
            (directory / "terminate").touch()  # a failed test still takes its cluster hosts down
        if store is not None:
            store.dispose()
