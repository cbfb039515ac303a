"""The engine started after a killed one takes in the checkpoints its agents could not report."""

from __future__ import annotations

import os
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from sqlalchemy import select

from broker.backends.local.recovery import publish_address, recover_checkpoints
from broker.clock import WallClock
from broker.store import Store, open_store
from broker.store.tables import AllocationRow, CheckpointReportRow, ClusterRow, JobRow, ProgressRow


def _job(store: Store, job_id: str, state: str, checkpoint_dir: Path, started: datetime) -> None:
    with store.transaction() as s:
        s.add(JobRow(id=job_id, name="t", team="a", state=state, priority=500, spec={}, backend="local",
                     num_nodes=1, gpus_per_node=1, checkpoint_dir=str(checkpoint_dir), created_at=started,
                     updated_at=started, zones=[], attempt=1))
        s.flush()
        s.add(ClusterRow(id=f"{job_id}-c1", launch_key=f"{job_id}-c1", job_id=job_id, backend="local", cloud="aws",
                         region="r", zone="z", instance_type="p3.2xlarge", gpus_per_node=1, num_nodes=1, spot=True,
                         price_per_node_hour=1.0, on_demand_price_per_node_hour=3.0, state="UP", handle={},
                         created_at=started))
        s.flush()
        s.add(AllocationRow(job_id=job_id, cluster_id=f"{job_id}-c1", attempt=1, gpus={"0": [0]}, started_at=started))


def _mark(directory: Path, text: str, at: float | None = None) -> None:
    """``LATEST`` saying ``text``, with the checkpoint it names (when inside ``directory``) written first."""
    named = directory / text.splitlines()[0]
    named.parent.mkdir(parents=True, exist_ok=True)
    named.write_text("weights")
    (directory / "LATEST").write_text(text)
    if at is not None:
        os.utime(directory / "LATEST", (at, at))


def _reports(store: Store) -> list[tuple[str, str, str, int | None]]:
    with store.transaction() as s:
        return [(r.job_id, r.cluster_id, r.path, r.step)
                for r in s.scalars(select(CheckpointReportRow).order_by(CheckpointReportRow.job_id))]


def test_the_newest_checkpoint_of_the_current_attempt_is_recorded_once(db_url: str, tmp_path: Path) -> None:
    store = open_store(db_url)
    started = datetime.now(UTC) - timedelta(minutes=5)
    for job_id, state in (("running", "RUNNING"), ("noticed", "CHECKPOINTING"), ("old", "RUNNING"),
                          ("done", "SUCCEEDED"), ("outside", "RUNNING"), ("none", "RUNNING")):
        _job(store, job_id, state, tmp_path / job_id, started)
    _mark(tmp_path / "running", "step-000100.npz\nstep=100\n")
    _mark(tmp_path / "noticed", "sub/step-000147.npz\nstep=147\nsave_seconds=0.5\n")
    _mark(tmp_path / "old", "step-000001.npz\n", at=(started - timedelta(minutes=1)).timestamp())  # before this attempt
    _mark(tmp_path / "done", "step-000400.npz\n")  # the engine is done with it
    _mark(tmp_path / "outside", "../running/step-000100.npz\n")  # never outside the job's own directory
    _mark(tmp_path / "none", "step-000002.npz\n")
    (tmp_path / "none" / "step-000002.npz").unlink()  # a marker naming nothing is no checkpoint

    assert sorted(recover_checkpoints(store, WallClock())) == ["noticed", "running"]
    assert _reports(store) == [("noticed", "noticed-c1", "sub/step-000147.npz", 147),
                               ("running", "running-c1", "step-000100.npz", 100)]
    assert recover_checkpoints(store, WallClock()) == []  # the same checkpoint is recorded once
    assert len(_reports(store)) == 2
    store.dispose()


@pytest.mark.parametrize("marker", ["\x00step\n", "\udcff\n".encode("utf-8", "surrogateescape"), b"x" * 100_000])
def test_a_hostile_marker_on_disk_records_nothing(db_url: str, tmp_path: Path, marker: str | bytes) -> None:
    store = open_store(db_url)
    _job(store, "j1", "RUNNING", tmp_path / "j1", datetime.now(UTC) - timedelta(minutes=5))
    (tmp_path / "j1").mkdir()
    (tmp_path / "j1" / "LATEST").write_bytes(marker if isinstance(marker, bytes) else marker.encode())
    assert recover_checkpoints(store, WallClock()) == []
    assert _reports(store) == []
    store.dispose()


def test_the_address_file_is_private_and_names_the_running_engine(tmp_path: Path) -> None:
    url = publish_address(tmp_path, "http://127.0.0.1:4242")
    path = tmp_path / "local" / "agents.url"
    assert url == f"file://{path}"
    assert path.read_text() == "http://127.0.0.1:4242\n" and (path.stat().st_mode & 0o777) == 0o600
    publish_address(tmp_path, "http://127.0.0.1:4343")  # the next engine takes over
    assert path.read_text() == "http://127.0.0.1:4343\n"
    assert [p.name for p in path.parent.iterdir()] == ["agents.url"]


def _progress(store: Store, job_id: str) -> list[tuple[int, int, int | None]]:
    with store.transaction() as s:
        return [(r.attempt, r.step, r.total) for r in s.scalars(
            select(ProgressRow).where(ProgressRow.job_id == job_id).order_by(ProgressRow.at, ProgressRow.id))]


def test_the_recovered_checkpoints_step_is_the_jobs_progress_when_no_report_said_as_much(db_url: str,
                                                                                        tmp_path: Path) -> None:
    """A job that went on, to its end even, while no engine ran showed the step it had reached when the
    engine died (`broker status`: SUCCEEDED at step 99 of 400), its later reports having found nobody."""
    store = open_store(db_url)
    started = datetime.now(UTC) - timedelta(minutes=5)
    for job_id in ("behind", "reported"):
        _job(store, job_id, "RUNNING", tmp_path / job_id, started)
        with store.transaction() as s:
            s.add(ProgressRow(job_id=job_id, attempt=1, step=99 if job_id == "behind" else 420, total=400,
                              at=started + timedelta(minutes=1)))
        _mark(tmp_path / job_id, "step-000400.npz\nstep=400\n")
    assert sorted(recover_checkpoints(store, WallClock())) == ["behind", "reported"]
    assert _progress(store, "behind") == [(1, 99, 400), (1, 400, 400)]
    assert _progress(store, "reported") == [(1, 420, 400)]  # a report already went as far: nothing added
    recover_checkpoints(store, WallClock())
    assert _progress(store, "behind") == [(1, 99, 400), (1, 400, 400)]  # once
    store.dispose()
