"""scripts/demo_ledger.py writes into a broker home of its own, says which, and leaves no job running."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from sqlalchemy import select

from broker.store import open_store
from broker.store.tables import JobRow

ROOT = Path(__file__).resolve().parents[2]


def test_demo_ledger_has_its_own_home_and_no_running_job(tmp_path: Path) -> None:
    mine = tmp_path / "mine"
    demo = tmp_path / "demo"
    env = {**os.environ, "BROKER_HOME": str(mine), "HOME": str(tmp_path)}
    done = subprocess.run([sys.executable, "scripts/demo_ledger.py", "--home", str(demo)], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert f"into the broker home {demo}" in done.stdout and f"BROKER_HOME={demo} broker report" in done.stdout
    assert not mine.exists()  # the user's own broker home is left alone
    store = open_store(f"sqlite:///{demo / 'broker.db'}")
    try:
        with store.transaction() as s:
            states = {job.id: job.state for job in s.scalars(select(JobRow))}
    finally:
        store.dispose()
    assert len(states) == 4 and set(states.values()) == {"SUCCEEDED"}, states
