"""`broker status` on the embedded store, read with sqlite3, prints what the SQLAlchemy path prints.

The same store is shown twice by the real command: through ``sqlite:///`` (the sqlite3 read path)
and through ``sqlite+pysqlite:///`` (a URL the fast path leaves to SQLAlchemy, the path every
other store takes).
"""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.status_stores import store_with_every_kind_of_job

ROOT = Path(__file__).resolve().parents[3]
ACTIVE = ("PENDING", "PROVISIONING", "RUNNING", "CHECKPOINTING", "MIGRATING")


def _status(url: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "BROKER_DB_URL": url}
    return subprocess.run([sys.executable, "-m", "broker", "status", *args], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=120)


def _both(path: Path, *args: str) -> tuple[subprocess.CompletedProcess[str], subprocess.CompletedProcess[str]]:
    return _status(f"sqlite:///{path}", *args), _status(f"sqlite+pysqlite:///{path}", *args)


def _settled(listed: Any) -> Any:
    """The JSON without the wall time of jobs still going (it grows between the two runs)."""
    for item in listed if isinstance(listed, list) else [listed]:
        if item["state"] in ACTIVE:
            item.pop("wall_seconds")
    return listed


@pytest.mark.slow
@pytest.mark.parametrize("many", [0, 60])
def test_status_prints_the_same_table_and_json_as_the_sqlalchemy_path(engine_held: Path, many: int) -> None:
    path = engine_held / "broker.db"
    ids = store_with_every_kind_of_job(f"sqlite:///{path}", many)
    fast, orm = _both(path)
    assert fast.returncode == orm.returncode == 0, fast.stderr + orm.stderr
    assert fast.stdout == orm.stdout and fast.stderr == orm.stderr == ""
    assert all(job_id in fast.stdout for job_id in ids) and "(stage 2 of p-1)" in fast.stdout
    assert "j-failed FAILED: exit 3: [red]not markup[/red] ünïcode ✓" in fast.stdout
    fast, orm = _both(path, "--json")
    assert _settled(json.loads(fast.stdout)) == _settled(json.loads(orm.stdout))
    assert len(json.loads(fast.stdout)) == len(ids)
    for job_id in ("j-running", "j-migrating", "j-succeeded", "j-pending", "j-stage2", "j-half-1"):
        fast, orm = _both(path, job_id)
        assert fast.stdout == orm.stdout and job_id in fast.stdout
        fast, orm = _both(path, job_id, "--json")
        assert _settled(json.loads(fast.stdout)) == _settled(json.loads(orm.stdout))
        gpu = json.loads(fast.stdout)["gpu"]
        # By hand: (2 h at 30 % + 1 h at 60 %) / 3 h = 40 %; the larger peak, 41000.5 MB = 40.0395 GB.
        assert gpu == ({"mean_utilization": 0.4, "peak_memory_gb": 40.04, "measured_gpu_hours": 3.0}
                       if job_id == "j-running" else None)
    fast, orm = _both(path, "j-nobody")
    assert fast.returncode == orm.returncode == 2 and fast.stderr == orm.stderr
    assert fast.stderr.strip() == "error: no job 'j-nobody'"


def test_the_newest_jobs_of_a_state_read_alike_on_both_paths(engine_held: Path) -> None:
    """``--limit`` keeps the newest jobs (printed oldest first) and says older ones were left out;
    ``--state`` keeps one state's; the sqlite3 path and SQLAlchemy's agree on both."""
    path = engine_held / "broker.db"
    store_with_every_kind_of_job(f"sqlite:///{path}")
    every = [item["job_id"] for item in json.loads(_status(f"sqlite:///{path}", "--json").stdout)]
    fast, orm = _both(path, "--json", "--limit", "3")
    assert _settled(json.loads(fast.stdout)) == _settled(json.loads(orm.stdout)) and fast.stderr == orm.stderr
    assert [item["job_id"] for item in json.loads(fast.stdout)] == every[-3:]
    assert "the newest 3 jobs" in fast.stderr
    fast, orm = _both(path, "--json", "--state", "running")
    listed = json.loads(fast.stdout)
    assert _settled(listed) == _settled(json.loads(orm.stdout)) and fast.stderr == ""
    assert listed and {item["state"] for item in listed} == {"RUNNING"}


def test_a_value_sqlite3_cannot_read_goes_the_sqlalchemy_way(engine_held: Path) -> None:
    """A row the migrations would never leave (a datetime that is not one): whatever SQLAlchemy's path
    says of it, the fast path says the same, in one line and with nothing written."""
    path = engine_held / "broker.db"
    store_with_every_kind_of_job(f"sqlite:///{path}")
    for garbage in ("not a time", "2026-13-45 99:99:99", "\x00" * 64, "9" * 5000):
        with sqlite3.connect(path) as conn:
            conn.execute("UPDATE jobs SET created_at = ? WHERE id = 'j-running'", (garbage,))
        before = _dump(path)
        fast, orm = _both(path, "--json")
        assert (fast.returncode, fast.stdout) == (orm.returncode, orm.stdout)
        assert fast.returncode == 2 and len(fast.stderr.strip().splitlines()) == 1, fast.stderr
        assert fast.stderr.startswith("error: cannot read the store at sqlite:///") and _dump(path) == before


def _dump(path: Path) -> str:
    with sqlite3.connect(path) as conn:
        return "\n".join(conn.iterdump())


@pytest.mark.parametrize("content", [b"", b"\x00" * 4096, b"SQLite format 3\x00" + b"\xff" * 4000,
                                     b"not a database at all\n" * 10_000])
def test_a_broker_db_that_is_not_a_store_is_one_line_and_exit_2(engine_held: Path, content: bytes) -> None:
    path = engine_held / "broker.db"
    path.write_bytes(content)
    fast, orm = _both(path)
    assert (fast.returncode, fast.stdout, fast.stderr) == (orm.returncode, orm.stdout,
                                                           orm.stderr.replace("sqlite+pysqlite:", "sqlite:"))
    if content:  # an empty file is an empty SQLite database: SQLAlchemy's path migrates it, as before
        assert fast.returncode == 2 and len(fast.stderr.strip().splitlines()) == 1, fast.stderr
        assert "cannot open the store" in fast.stderr and "Traceback" not in fast.stderr
    else:
        assert fast.returncode == 0 and "job" in fast.stdout
