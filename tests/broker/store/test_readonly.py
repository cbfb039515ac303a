"""`broker status` reads an embedded store with sqlite3 (broker/status/readonly.py): the same summaries,
so the same table and JSON, as the SQLAlchemy path, over stores holding every kind of job."""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from broker.cli.job_output import print_status
from broker.model import JobState
from broker.status.orm_source import SessionSource
from broker.status.readonly import open_readonly
from broker.status.summary import summaries
from broker.store import open_store
from broker.store.tables import LeaderLeaseRow
from tests.status_stores import NOW, T0, store_with_every_kind_of_job

ROOT = Path(__file__).resolve().parents[3]


def _orm(url: str, job_id: str | None) -> list[dict[str, Any]] | None:
    store = open_store(url)
    try:
        with store.transaction() as s:
            return summaries(SessionSource(s), job_id, NOW)
    finally:
        store.dispose()


def _fast(url: str, job_id: str | None) -> list[dict[str, Any]] | None:
    fast = open_readonly(url)
    assert fast is not None, "an embedded store at the newest migration is read with sqlite3"
    try:
        with fast.snapshot():
            return summaries(fast, job_id, NOW)
    finally:
        fast.close()


def _printed(found: list[dict[str, Any]], job_id: str | None, as_json: bool,
             capsys: pytest.CaptureFixture[str]) -> str:
    capsys.readouterr()
    print_status(found, job_id, as_json)
    return capsys.readouterr().out


@pytest.mark.parametrize("many", [0, 150])
def test_both_readers_print_the_same_table_and_json_for_every_job_and_for_each_one(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], many: int) -> None:
    url = f"sqlite:///{tmp_path / 'store.db'}"
    ids = store_with_every_kind_of_job(url, many)
    listed = _fast(url, None)
    assert listed == _orm(url, None)
    assert listed is not None and sorted(x["job_id"] for x in listed) == sorted(ids)
    # The store holds what the comparison is meant to cover, so an empty or trivial read cannot pass.
    assert {x["state"] for x in listed} == {s.value for s in JobState}
    by_id = {x["job_id"]: x for x in listed}
    assert by_id["j-running"]["progress"] == {"step": 81, "total": 400}
    assert by_id["j-running"]["prediction_source"] == "work" and by_id["j-running"]["wall_seconds"] > 0
    assert by_id["j-running"]["earlier_prediction_error"]["jobs"] == 5  # j-succeeded and the 4 earlier
    if many:
        assert by_id["j-many-0001"]["earlier_prediction_error"]["jobs"] == 20  # the latest 20 of 50
    assert by_id["j-migrating"]["zone"] == "us-east-1b" and by_id["j-migrating"]["spot"] is False
    assert by_id["j-provisioning"]["zone"] is None and by_id["j-succeeded"]["prediction_error_s"] is not None
    assert by_id["j-stage2"]["stage"] == 2 and by_id["j-half-2"]["cost"] == 0.0
    for as_json in (False, True):
        assert _printed(listed, None, as_json, capsys) == _printed(_orm(url, None) or [], None, as_json, capsys)
    for job_id in ids[:30]:
        one = _fast(url, job_id)
        assert one is not None and one == _orm(url, job_id)
        for as_json in (False, True):
            assert _printed(one, job_id, as_json, capsys) == _printed(_orm(url, job_id) or [], job_id, as_json,
                                                                      capsys)
    assert _fast(url, "j-nobody") is None and _orm(url, "j-nobody") is None


def test_both_readers_count_the_same_unattended_jobs_and_clusters(tmp_path: Path) -> None:
    from broker.cli.engine import unattended

    url = f"sqlite:///{tmp_path / 'store.db'}"
    store_with_every_kind_of_job(url)
    for led in (False, True):
        store = open_store(url)
        if led:  # a `broker serve` leads this store: the CLI never starts an engine for it
            with store.transaction() as s:
                s.merge(LeaderLeaseRow(name="engine", holder="replica-1", epoch=3, expires_at=T0))
        expected = unattended(store)
        store.dispose()
        fast = open_readonly(url)
        assert fast is not None
        assert fast.unattended() == expected == ((0, 0) if led else (8, 2))
        fast.close()


def test_only_a_plain_sqlite_store_at_the_newest_migration_is_read_without_sqlalchemy(
        tmp_path: Path, postgres_url: str) -> None:
    from alembic import command

    from broker.store.db import alembic_config

    at_head = tmp_path / "head.db"
    open_store(f"sqlite:///{at_head}").dispose()
    assert open_readonly(f"sqlite:///{at_head}") is not None
    behind = tmp_path / "behind.db"
    open_store(f"sqlite:///{behind}").dispose()
    command.downgrade(alembic_config(f"sqlite:///{behind}"), "0009_sharing")
    foreign = tmp_path / "foreign.db"
    with sqlite3.connect(foreign) as conn:
        conn.execute("CREATE TABLE t (x)")
    garbage = tmp_path / "garbage.db"
    garbage.write_bytes(b"\x00" * 3000 + b"not a database" * 1000)
    renamed = tmp_path / "a%20b?.db"
    renamed.write_bytes(at_head.read_bytes())
    for url in (f"sqlite:///{behind}", f"sqlite:///{foreign}", f"sqlite:///{garbage}", f"sqlite:///{tmp_path}/none.db",
                f"sqlite:///{tmp_path}", "sqlite://", "sqlite:///:memory:", f"sqlite+pysqlite:///{at_head}",
                f"sqlite:///{at_head}?mode=ro", f"sqlite:///{renamed}", postgres_url):
        assert open_readonly(url) is None, url
    assert not (tmp_path / "none.db").exists()  # the read path creates nothing; SQLAlchemy's creates and migrates


def test_a_store_read_with_sqlite3_is_left_as_it_was(tmp_path: Path) -> None:
    path = tmp_path / "store.db"
    store_with_every_kind_of_job(f"sqlite:///{path}")
    before = path.read_bytes()
    fast = open_readonly(f"sqlite:///{path}")
    assert fast is not None
    with pytest.raises(sqlite3.OperationalError, match="readonly"):
        fast.conn.execute("DELETE FROM jobs")
    with fast.snapshot():
        assert len(summaries(fast, None, NOW) or []) == 16
    fast.close()
    assert path.read_bytes() == before


def test_json_of_both_readers_is_plain_json(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'store.db'}"
    store_with_every_kind_of_job(url)
    assert json.loads(json.dumps(_fast(url, None))) == _orm(url, None)


CHAIN = """\
name: prep
resources:
  accelerators: V100:1
run: sleep 1
---
name: fit
resources:
  accelerators: V100:1
run: sleep 1
"""
FAILS = "name: broken\nresources:\n  accelerators: V100:1\nrun: exit 3\n"
LONG = "name: long\nresources:\n  accelerators: V100:1\nrun: sleep 600\n"


def _broker(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    done = subprocess.run([sys.executable, "-m", "broker", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=120)
    assert not check or done.returncode == 0, done.stderr
    return done


@pytest.mark.slow
def test_both_readers_agree_at_every_moment_of_real_jobs(broker_home: Path, tmp_path: Path) -> None:
    """The engine drives the quickstart (a preemption, a migration), a chain, a failing job and a
    cancelled one; copies of the store taken while they run are read both ways."""
    for name, text in (("chain.yaml", CHAIN), ("fails.yaml", FAILS), ("long.yaml", LONG)):
        (tmp_path / name).write_text(text)
    # All launched at once, so copies are taken while every one of them is on its way.
    launches = [subprocess.Popen([sys.executable, "-m", "broker", "launch", *args], cwd=ROOT, stdout=subprocess.PIPE,
                                 stderr=subprocess.PIPE, text=True)
                for args in (["examples/quickstart.yaml", "--json"],
                             *([str(tmp_path / name), "--detach", "--market-clock", "shared"]
                               for name in ("chain.yaml", "fails.yaml", "long.yaml")))]
    store = broker_home / "broker.db"
    seen: set[str] = set()
    compared, cancelled = 0, False
    try:
        _wait(lambda: store.exists() and open_readonly(f"sqlite:///{store}") is not None)
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            copy = tmp_path / f"copy-{compared}.db"
            with sqlite3.connect(f"{store.resolve().as_uri()}?mode=ro", uri=True) as live, \
                    sqlite3.connect(copy) as snapshot:
                live.backup(snapshot)
            listed = _fast(f"sqlite:///{copy}", None) or []
            assert listed == _orm(f"sqlite:///{copy}", None)
            compared += 1
            seen |= {x["state"] for x in listed}
            copy.unlink()
            running = [x["job_id"] for x in listed if x["name"] == "long" and x["state"] == "RUNNING"]
            if running and not cancelled:
                cancelled = _broker("cancel", running[0]).returncode == 0
            if all(p.poll() is not None for p in launches) and len(listed) == 5 and not {
                    x["state"] for x in listed} & {"PENDING", "PROVISIONING", "RUNNING", "CHECKPOINTING", "MIGRATING"}:
                break
            time.sleep(0.2)
    finally:
        for launch in launches:
            if launch.poll() is None:
                launch.terminate()
            launch.communicate(timeout=60)
    final = {x["name"]: x for x in _fast(f"sqlite:///{store}", None) or []}
    assert final["quickstart"]["state"] == "SUCCEEDED" and final["quickstart"]["migrations"] >= 1
    assert final["broken"]["state"] == "FAILED" and final["long"]["state"] == "CANCELLED"
    assert final["fit"]["stage"] == 2 and final["fit"]["state"] == "SUCCEEDED"
    assert {"RUNNING", "SUCCEEDED", "FAILED", "CANCELLED"} <= seen and compared >= 10


def _wait(what: Any, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if what():
            return
        time.sleep(0.2)
    raise AssertionError("timed out")
