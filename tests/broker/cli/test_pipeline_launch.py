"""`broker launch` runs a multi-document job file: a chain's stages one after another, a group's
together, each stage a job of its own (placed, preempted and migrated on its own)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from datetime import datetime
from pathlib import Path

import pytest
from sqlalchemy import select

from broker.store import open_store
from broker.store.tables import JobEventRow, JobRow

ROOT = Path(__file__).resolve().parents[3]

STAGE = """\
name: {name}
resources:
  accelerators: V100:1
run: {run}
"""


def _file(path: Path, header: str, runs: dict[str, str]) -> Path:
    documents = [header] if header else []
    documents += [STAGE.format(name=name, run=run) for name, run in runs.items()]
    path.write_text("---\n".join(documents))
    return path


def _launch(home: Path, job_file: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "BROKER_HOME": str(home)}
    return subprocess.run([sys.executable, "-m", "broker", "launch", str(job_file), *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=600)


def _first_move(home: Path, job_id: str) -> datetime:
    """When the stage first headed to GPUs (market clock)."""
    store = open_store(f"sqlite:///{home / 'broker.db'}")
    try:
        with store.transaction() as s:
            at = s.scalar(select(JobEventRow.at).where(JobEventRow.job_id == job_id,
                                                       JobEventRow.to_state == "PROVISIONING")
                          .order_by(JobEventRow.at))
            assert at is not None
            return at
    finally:
        store.dispose()


@pytest.mark.slow
def test_a_chain_runs_its_stages_one_after_another(broker_home: Path, tmp_path: Path) -> None:
    job_file = _file(tmp_path / "etl.yaml", "name: etl\n", {"prep": "echo prepared", "train": "echo trained"})
    result = _launch(broker_home, job_file, "--json")
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert report["pipeline"] == "etl"
    prep, train = report["stages"]
    assert [prep["name"], train["name"]] == ["prep", "train"]
    assert [prep["state"], train["state"]] == ["SUCCEEDED", "SUCCEEDED"]
    assert prep["pipeline_id"] == train["pipeline_id"] and [prep["stage"], train["stage"]] == [1, 2]
    assert _first_move(broker_home, train["job_id"]) >= datetime.fromisoformat(prep["finished_at"])


@pytest.mark.slow
def test_a_failed_stage_stops_the_chain_and_says_why(broker_home: Path, tmp_path: Path) -> None:
    job_file = _file(tmp_path / "etl.yaml", "", {"prep": "exit 3", "train": "echo never"})
    result = _launch(broker_home, job_file, "--json")
    assert result.returncode == 1
    prep, train = json.loads(result.stdout.strip().splitlines()[-1])["stages"]
    assert (prep["state"], prep["exit_code"]) == ("FAILED", 3)
    assert train["state"] == "CANCELLED"
    assert train["reason"] == "stage 1 (prep) ended FAILED: the pipeline stops there"
    store = open_store(f"sqlite:///{broker_home / 'broker.db'}")
    try:
        with store.transaction() as s:
            never = s.get(JobRow, train["job_id"])
            assert never is not None and never.attempt == 0 and never.started_at is None
    finally:
        store.dispose()


@pytest.mark.slow
def test_a_job_group_runs_its_stages_together(broker_home: Path, tmp_path: Path) -> None:
    job_file = _file(tmp_path / "group.yaml", "name: pair\nexecution: parallel\n",
                     {"left": "sleep 2; echo left", "right": "sleep 2; echo right"})
    result = _launch(broker_home, job_file, "--json")
    assert result.returncode == 0, result.stderr[-3000:]
    left, right = json.loads(result.stdout.strip().splitlines()[-1])["stages"]
    assert [left["state"], right["state"]] == ["SUCCEEDED", "SUCCEEDED"]
    # Neither waited for the other: each headed to GPUs before the other finished.
    assert _first_move(broker_home, right["job_id"]) < datetime.fromisoformat(left["finished_at"])
    assert _first_move(broker_home, left["job_id"]) < datetime.fromisoformat(right["finished_at"])


def test_a_pipeline_is_not_dry_run_whole(broker_home: Path, tmp_path: Path) -> None:
    job_file = _file(tmp_path / "etl.yaml", "name: etl\n", {"prep": "echo a", "train": "echo b"})
    result = _launch(broker_home, job_file, "--backend", "skypilot", "--dryrun")
    assert result.returncode == 2
    assert result.stderr.strip().splitlines()[-1].endswith("is a 2-stage chain; dry-run one task file at a time")
    if (broker_home / "broker.db").exists():  # the SkyPilot backend reads its price book first
        store = open_store(f"sqlite:///{broker_home / 'broker.db'}")
        try:
            with store.transaction() as s:
                assert s.scalars(select(JobRow)).first() is None
        finally:
            store.dispose()
