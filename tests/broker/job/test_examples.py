"""The three framework examples end to end: ``broker launch`` on the embedded default, a spot
interruption once the job has checkpointed, a migration, a resume from the checkpoint the helper
wrote, and the same final parameters as an uninterrupted run.

The interruption comes when the job is ready for it, not at a market time fixed in advance: how
long importing PyTorch, Lightning or Transformers takes depends on the machine. The market is the
bundled one's V100 zones with their room held steady, so nothing is preempted by the trace, and
once the first checkpoint is reported the test asks the local cloud for a spot interruption of
the job's cluster (its ``interrupt`` request, as AWS FIS's ``send-spot-instance-interruptions``):
the notice at once, the nodes taken two market minutes later.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import sqlite3
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import TypeVar

import pytest
from sqlalchemy import select

from broker.backends.local.runtime import BUNDLED_MARKET
from broker.store import Store, open_store
from broker.store.tables import AllocationRow, CheckpointReportRow, ClusterRow
from providers.trace import read_trace, write_trace

ROOT = Path(__file__).resolve().parents[3]
MARKET_MINUTE_S = 60.0
# Market seconds per wall second: the interruption's two market minutes of notice are 12 wall seconds,
# for the agent to hear the notice and the job to save and report its checkpoint.
SPEED = "10"
FRAMEWORKS = {"pytorch": "torch", "lightning": "lightning", "huggingface": "transformers"}
T = TypeVar("T")


def _digest(text: str) -> str:
    [digest] = re.findall(r"parameters sha256 (\w+)", text)
    return digest


def steady_market(path: Path) -> Path:
    """The bundled market's one-V100 zones at their first tick's prices, with room for every job all
    along: no preemption and no reason to move comes from the trace."""
    bundled = read_trace(BUNDLED_MARKET)
    first = [q for q in bundled.quotes_at(0) if (q.accelerator, q.gpus_per_node) == ("V100", 1)]
    assert len(first) >= 2  # a zone to be interrupted in and one to move to
    write_trace(path, [replace(q, observed_at=bundled.time_of(tick), available_nodes=64)
                       for tick in range(bundled.num_ticks) for q in first])
    return path


def wait_for(value: Callable[[], T | None], timeout: float, what: str, launch: subprocess.Popen[str]) -> T:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = value()
        if found is not None:
            return found
        if launch.poll() is not None:
            raise AssertionError(f"broker launch exited ({launch.returncode}) before {what}")
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


def first_checkpoint(home: Path) -> tuple[str, str, int] | None:
    """(job id, cluster id, step) of the first checkpoint reported, once one is; the cluster still runs the job."""
    database = home / "broker.db"
    if not database.exists():
        return None
    try:  # read-only, beside the broker that writes it
        with contextlib.closing(sqlite3.connect(f"file:{database}?mode=ro", uri=True, timeout=5)) as db:
            row = db.execute("SELECT job_id, cluster_id, step FROM checkpoint_reports ORDER BY id LIMIT 1").fetchone()
    except sqlite3.Error:  # the broker is still creating its tables
        return None
    return None if row is None else (str(row[0]), str(row[1]), int(row[2]))


def clusters_of(store: Store, job_id: str) -> list[ClusterRow]:
    with store.transaction() as s:
        ids = s.scalars(select(AllocationRow.cluster_id).where(AllocationRow.job_id == job_id)
                        .order_by(AllocationRow.attempt)).all()
        rows = [s.get(ClusterRow, i) for i in dict.fromkeys(ids)]
        s.expunge_all()
        return [r for r in rows if r is not None]


@pytest.mark.slow
@pytest.mark.timeout(900)
@pytest.mark.parametrize("framework", sorted(FRAMEWORKS))
def test_example_survives_a_preemption_and_ends_as_an_uninterrupted_run(broker_home: Path, tmp_path: Path,
                                                                         framework: str) -> None:
    pytest.importorskip(FRAMEWORKS[framework])
    # One intra-op thread in every run (the local cloud's nodes inherit it): on the CPU the order of a
    # parallel reduction depends on the thread count, and on a loaded machine OpenMP threads waiting
    # for a core spin, costing several times the work.
    threads = {"OMP_NUM_THREADS": "1"}
    env = {**os.environ, **threads, "BROKER_HOME": str(broker_home), "BROKER_SPEED": SPEED,
           "BROKER_LOCAL_PROVISION_SECONDS": "30", "BROKER_MARKET": str(steady_market(tmp_path / "steady-market.csv"))}
    outputs = {name: (tmp_path / name).open("w") for name in ("launch.out", "launch.err", "direct.out", "direct.err")}
    launch = subprocess.Popen([sys.executable, "-m", "broker", "launch", f"examples/{framework}.yaml", "--json"],
                              cwd=ROOT, env=env, stdout=outputs["launch.out"], stderr=outputs["launch.err"])
    # Meanwhile (the broker's run is mostly its paced steps' sleep), the same script without the broker,
    # no pacing, no interruption: the parameters to end with.
    direct = subprocess.Popen([sys.executable, f"train_{framework}.py", "--steps", "400"], cwd=ROOT / "examples",
                              env={**os.environ, **threads, "BROKER_CHECKPOINT_DIR": str(tmp_path / "direct"),
                                   "BROKER_RESUME_FROM": ""},
                              stdout=outputs["direct.out"], stderr=outputs["direct.err"])
    try:
        job_id, cluster_id, first_step = wait_for(lambda: first_checkpoint(broker_home), 420,
                                                  "the first checkpoint report", launch)
        (broker_home / "local" / "clusters" / cluster_id / "interrupt").touch()
        launch.wait(timeout=420)
        direct.wait(timeout=300)
    finally:
        for process in (launch, direct):
            if process.poll() is None:
                process.kill()
                process.wait()
        for output in outputs.values():
            output.close()
        # A launch cut short leaves its clusters up: take them down as the local cloud does.
        for cluster in (broker_home / "local" / "clusters").glob("*/"):
            (cluster / "terminate").touch()
    assert launch.returncode == 0, (tmp_path / "launch.err").read_text()[-3000:]
    summary = json.loads((tmp_path / "launch.out").read_text().strip().splitlines()[-1])
    assert summary["job_id"] == job_id and summary["state"] == "SUCCEEDED"
    assert summary["preemptions"] >= 1 and summary["migrations"] >= 1
    assert summary["work_lost_seconds"] < 2 * MARKET_MINUTE_S

    store = open_store(f"sqlite:///{broker_home / 'broker.db'}")
    try:
        clusters = clusters_of(store, job_id)
        with store.transaction() as s:
            timed = list(s.scalars(select(CheckpointReportRow.save_seconds).where(
                CheckpointReportRow.job_id == job_id)))
    finally:
        store.dispose()
    # The interrupted cluster's cloud gave the notice (the job left it before or when its nodes were
    # taken); the job moved to another zone.
    status = json.loads((broker_home / "local" / "clusters" / cluster_id / "status.json").read_text())
    assert clusters[0].id == cluster_id and "notice_wall" in status, status
    assert len(clusters) >= 2 and clusters[-1].zone != clusters[0].zone
    # The save times the helper measured reached the broker with the checkpoints (its Young/Daly input).
    assert timed and all(x is not None and x >= 0 for x in timed)

    logs = sorted((broker_home / "logs" / job_id).glob("attempt-*-node-0.log"),
                  key=lambda p: int(p.name.split("-")[1]))
    texts = [log.read_text() for log in logs]
    saved = [[int(s) for s in re.findall(r"^checkpoint step-(\d+) ", text, re.MULTILINE)] for text in texts]
    assert saved[0], texts[0][-3000:]  # the first attempt checkpointed before its node was taken
    assert max(saved[0]) > first_step, texts[0][-3000:]  # and again once the interruption's notice came
    for before, text in zip(saved, texts[1:], strict=False):
        assert f"resuming from step-{max(before):08d}" in text  # from the newest, not from the start

    assert direct.returncode == 0, (tmp_path / "direct.err").read_text()[-3000:]
    assert _digest(texts[-1]) == _digest((tmp_path / "direct.out").read_text())
