"""An agent whose engine was killed reports to the engine started after it (``file://`` address),
and sends again a checkpoint report nobody answered."""

from __future__ import annotations

import socket
from datetime import UTC, datetime
from pathlib import Path

import pytest
from sqlalchemy import select

from broker.agent.events import EventLog
from broker.agent.node import CheckpointReporter
from broker.agent.reporting import current_url
from broker.api.app import BackgroundServer, create_app
from broker.clock import WallClock
from broker.store import Store, open_store
from broker.store.tables import AllocationRow, CheckpointReportRow, ClusterRow, JobRow
from broker.tokens import token_digest


def _store(tmp_path: Path, checkpoint_dir: Path) -> Store:
    store = open_store(f"sqlite:///{tmp_path / 'store.db'}")
    now = datetime.now(UTC)
    with store.transaction() as s:
        s.add(JobRow(id="j1", name="t", team="a", state="RUNNING", priority=500, spec={}, backend="local",
                     num_nodes=1, gpus_per_node=1, checkpoint_dir=str(checkpoint_dir), created_at=now,
                     updated_at=now, zones=[]))
        s.flush()
        s.add(ClusterRow(id="c1", launch_key="c1", job_id="j1", backend="local", cloud="aws", region="r", zone="z",
                         instance_type="p3.2xlarge", gpus_per_node=1, num_nodes=1, spot=True,
                         price_per_node_hour=1.0, on_demand_price_per_node_hour=3.0, state="UP",
                         token_hash=token_digest("agent-secret"), handle={}, created_at=now))
        s.flush()
        s.add(AllocationRow(job_id="j1", cluster_id="c1", attempt=1, gpus={"0": [0]}, started_at=now))
    return store


def _dead_address() -> str:
    with socket.socket() as sock:  # a port nothing listens on once closed: the killed engine's
        sock.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{sock.getsockname()[1]}"


def test_a_checkpoint_nobody_answered_for_reaches_the_engine_started_next(tmp_path: Path) -> None:
    checkpoints = tmp_path / "ckpt"
    checkpoints.mkdir()
    store = _store(tmp_path, checkpoints)
    address = tmp_path / "agents.url"
    address.write_text(_dead_address() + "\n")
    reporter = CheckpointReporter(f"file://{address}", "agent-secret", "c1", "0", "j1", str(checkpoints),
                                  EventLog(None))
    reporter.RETRY_SECONDS = 0.5  # the engine stays dead longer than the agent retries
    (checkpoints / "step-10").write_text("weights")
    (checkpoints / "LATEST").write_text("step-10\nstep=10\n")
    reporter.watch()
    reporter.flush(timeout=30)
    assert reporter.undelivered is not None

    server = BackgroundServer(create_app(store, WallClock())).start()
    try:
        address.write_text(server.url + "\n")  # what the next engine does as it starts
        reporter.RETRY_SECONDS = 60.0
        reporter.watch()  # no new checkpoint: the one nobody answered for goes again
        reporter.flush(timeout=30)
    finally:
        server.stop()
    with store.transaction() as s:
        rows = list(s.scalars(select(CheckpointReportRow)))
    assert [(r.path, r.step) for r in rows] == [("step-10", 10)]
    assert reporter.undelivered is None
    store.dispose()


def test_the_address_file_is_read_at_each_report_and_garbage_in_it_is_an_error_not_a_post(tmp_path: Path) -> None:
    address = tmp_path / "agents.url"
    assert current_url("http://host:1/v1/notices") == "http://host:1/v1/notices"
    address.write_text("http://127.0.0.1:5/\n")
    assert current_url(f"file://{address}/v1/notices") == "http://127.0.0.1:5/v1/notices"
    address.write_text("http://127.0.0.1:6\n")
    assert current_url(f"file://{address}/v1/checkpoints") == "http://127.0.0.1:6/v1/checkpoints"
    for garbage in ("", "file:///etc/passwd", "\x00" * 10, "x" * 100_000):
        address.write_text(garbage)
        with pytest.raises(OSError):
            current_url(f"file://{address}/v1/notices")
    address.unlink()
    with pytest.raises(OSError):
        current_url(f"file://{address}/v1/notices")
