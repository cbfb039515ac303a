"""The agent reports every checkpoint the job marks, to the real API, so the broker never reads a disk."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path

from sqlalchemy import select

from broker.agent.checkpoint import latest_checkpoint
from broker.api.app import BackgroundServer, create_app
from broker.clock import WallClock
from broker.store import Store, open_store
from broker.store.tables import AllocationRow, CheckpointReportRow, ClusterRow, JobRow
from broker.tokens import token_digest
from tests.cloud_metadata import FakeImds, imds_server

JOB = """
import os, sys, time
from pathlib import Path
d = Path(os.environ["BROKER_CHECKPOINT_DIR"])
def mark(text):
    (d / ".tmp").write_text(text)
    os.replace(d / ".tmp", d / "LATEST")
for step in (10, 20):
    (d / f"step-{step}").write_text("weights")
    mark(f"step-{step}\\nstep={step}\\n")
    time.sleep(0.5)
mark("/etc/passwd")  # outside the directory: never reported
time.sleep(0.5)
(d / "step-30").write_text("weights")
mark("step-30\\nstep=30\\nsave_seconds=1.250\\n")  # the last one, just before exit: reported all the same
sys.exit(0)
"""


def _store(tmp_path: Path) -> Store:
    store = open_store(f"sqlite:///{tmp_path / 'store.db'}")
    now = datetime.now(UTC)
    with store.transaction() as s:
        s.add(JobRow(id="j1", name="t", team="a", state="RUNNING", priority=500, spec={}, backend="local",
                     num_nodes=1, gpus_per_node=1, checkpoint_dir="s3://bucket/run", created_at=now,
                     updated_at=now, zones=[]))
        s.flush()
        s.add(ClusterRow(id="c1", launch_key="c1", job_id="j1", backend="local", cloud="aws", region="r", zone="z",
                         instance_type="p3.2xlarge", gpus_per_node=1, num_nodes=1, spot=True,
                         price_per_node_hour=1.0, on_demand_price_per_node_hour=3.0, state="UP",
                         token_hash=token_digest("agent-secret"), handle={}, created_at=now))
        s.flush()
        s.add(AllocationRow(job_id="j1", cluster_id="c1", attempt=1, gpus={"0": [0]}, started_at=now))
    return store


def test_every_checkpoint_the_job_marks_is_reported_with_its_step(tmp_path: Path) -> None:
    store = _store(tmp_path)
    server = BackgroundServer(create_app(store, WallClock())).start()
    ckpt = tmp_path / "mounted-bucket"
    ckpt.mkdir()
    job = tmp_path / "job.py"
    job.write_text(JOB)
    status = tmp_path / "status"
    try:
        with imds_server(FakeImds()) as metadata:
            code = subprocess.run(
                [sys.executable, "-m", "broker.agent", "--cloud", "aws", "--metadata-url", metadata,
                 "--poll", "50ms", "--cluster-id", "c1", "--broker-url", server.url,
                 "--checkpoint-dir", str(ckpt), "--status-file", str(status), "--", sys.executable, str(job)],
                env={**os.environ, "BROKER_JOB_ID": "j1", "BROKER_AGENT_TOKEN": "agent-secret"},
                timeout=60).returncode
    finally:
        server.stop()
    assert code == 0
    with store.transaction() as s:
        rows = list(s.scalars(select(CheckpointReportRow).order_by(CheckpointReportRow.written_at)))
    assert [(r.path, r.step, r.node) for r in rows] == [("step-10", 10, "0"), ("step-20", 20, "0"),
                                                        ("step-30", 30, "0")]
    assert [r.save_seconds for r in rows] == [None, None, 1.25]  # as the job measured it (broker.job writes it)
    events = [json.loads(line)["event"] for line in Path(str(status) + ".events").read_text().splitlines()]
    assert events.count("checkpoint_reported") == 3
    assert "checkpoint_outside_dir" in events


def test_the_marker_may_carry_a_step_and_garbage_does_not_break_it(tmp_path: Path) -> None:
    (tmp_path / "LATEST").write_text("step-7\nstep=7\n")
    mark = latest_checkpoint(tmp_path)
    assert mark is not None and (Path(mark.path).name, mark.step) == ("step-7", 7)
    for text, step in (("a\nstep=-3\n", None), ("a\nstep=10000000000000000000000\n", None), ("a\nstep=x", None),
                       ("a\n" + "junk\n" * 10_000, None)):
        (tmp_path / "LATEST").write_text(text)
        mark = latest_checkpoint(tmp_path)
        assert mark is not None and mark.step == step
    for text, seconds in (("a\nsave_seconds=2.5\n", 2.5), ("a\nsave_seconds=nan\n", None),
                          ("a\nsave_seconds=inf\n", None), ("a\nsave_seconds=-1\n", None),
                          ("a\nsave_seconds=1e300\n", None), ("a\nsave_seconds=" + "9" * 5000 + "\n", None),
                          ("a\nsave_seconds=soon\n", None)):
        (tmp_path / "LATEST").write_text(text)
        mark = latest_checkpoint(tmp_path)
        assert mark is not None and mark.save_seconds == seconds, text[:40]
    (tmp_path / "LATEST").write_bytes(b"\x00\xff\xfe")
    assert latest_checkpoint(tmp_path) is None
