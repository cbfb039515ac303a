"""The progress contract: lines the agent reads, the progress file, and reports to the real API."""

from __future__ import annotations

import io
import os
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st
from sqlalchemy import select

from broker.agent.progress import Progress, ProgressReporter, parse_line, pass_through, read_progress_file
from broker.api.app import BackgroundServer, create_app
from broker.clock import WallClock
from broker.store.tables import ProgressRow
from tests.broker.agent.test_checkpoint_reports import _store
from tests.cloud_metadata import FakeImds, imds_server


@pytest.mark.parametrize(("line", "expected"), [
    (b"BROKER_PROGRESS step=120 total=400", Progress(120, 400)),
    (b"[rank0] BROKER_PROGRESS step=7", Progress(7, None)),
    ("epoch 1:  30%|███       | 120/400 [00:12<00:28,  9.80it/s]".encode(), Progress(120, 400)),
    (b" 10/400 [00:01<00:39] 11/400 [00:01<00:38]", Progress(11, 400)),
    (b"loss 0.25 on 2024/11/24", None),
    (b"12/25 [", Progress(12, 25)),
    (b"1.5/3 [", None),
    (b"BROKER_PROGRESS step=-1", None),
    (b"BROKER_PROGRESS step=99999999999999999999999", None),
    (b"BROKER_PROGRESS step=5 total=0", None),
    (b"\x00\xff BROKER_PROGRESS step=3 total=4", Progress(3, 4)),
    (b"x" * 10_000 + b" BROKER_PROGRESS step=3", None),
])
def test_lines_the_agent_reads(line: bytes, expected: Progress | None) -> None:
    assert parse_line(line) == expected


@given(st.binary(max_size=300))
def test_no_output_breaks_the_reader(line: bytes) -> None:
    found = parse_line(line)
    assert found is None or 0 <= found.step <= 2**62


@pytest.mark.parametrize(("text", "expected"), [
    ('{"step": 5, "total": 10}', Progress(5, 10)),
    ('{"step": 5}', Progress(5, None)),
    ('{"step": true}', None), ('{"step": 1.5}', None), ('{"step": -2}', None), ("[1, 2]", None),
    ('{"step": ' + "[" * 5000 + "]" * 5000 + "}", None), ("not json", None), ('{"step": 1' + " " * 5000 + "}", None),
])
def test_the_progress_file(tmp_path: Path, text: str, expected: Progress | None) -> None:
    path = tmp_path / "progress.json"
    path.write_text(text)
    assert read_progress_file(str(path)) == expected
    assert read_progress_file(str(tmp_path / "missing")) is None


def test_output_is_passed_through_unchanged_while_read(tmp_path: Path) -> None:
    data = b"start\r 1/4 [\r 2/4 [\rBROKER_PROGRESS step=3 total=4\nbinary \x00\xff tail 4/4 ["
    read, write = os.pipe()
    os.write(write, data)
    os.close(write)
    sink = io.BytesIO()

    class Events:
        def write(self, event: str, **data: object) -> None:
            pass

    reporter = ProgressReporter(None, None, "c1", "0", "j1", Events())
    with os.fdopen(read, "rb") as source:
        pass_through(source, reporter, sink).join(timeout=5)
    assert sink.getvalue() == data
    assert reporter.latest == Progress(4, 4)


TRAIN = """
import json, os, sys, time
print("starting", flush=True)
for step in range(1, 31):
    time.sleep(0.05)
    if step <= 10:
        print(f"BROKER_PROGRESS step={step} total=30", flush=True)
    elif step <= 20:
        sys.stderr.write(f"\\r{step * 100 // 30}%|###   | {step}/30 [00:01<00:01, 20.0it/s]")
        sys.stderr.flush()
    else:
        with open(os.environ["BROKER_PROGRESS_FILE"] + ".tmp", "w") as f:
            json.dump({"step": step, "total": 30}, f)
        os.replace(os.environ["BROKER_PROGRESS_FILE"] + ".tmp", os.environ["BROKER_PROGRESS_FILE"])
print("done", flush=True)
"""


def test_a_job_reports_progress_in_every_form_to_the_real_api(tmp_path: Path) -> None:
    store = _store(tmp_path)
    server = BackgroundServer(create_app(store, WallClock())).start()
    job = tmp_path / "job.py"
    job.write_text(TRAIN)
    started = datetime.now(UTC)
    try:
        with imds_server(FakeImds()) as metadata:
            result = subprocess.run(
                [sys.executable, "-m", "broker.agent", "--cloud", "aws", "--metadata-url", metadata,
                 "--poll", "50ms", "--cluster-id", "c1", "--broker-url", server.url,
                 "--checkpoint-dir", str(tmp_path), "--status-file", str(tmp_path / "status"),
                 "--", sys.executable, str(job)],
                env={**os.environ, "BROKER_JOB_ID": "j1", "BROKER_AGENT_TOKEN": "agent-secret"},
                timeout=60, capture_output=True)
    finally:
        server.stop()
    assert result.returncode == 0
    assert b"starting" in result.stdout and b"BROKER_PROGRESS step=10 total=30" in result.stdout
    assert b"20/30 [" in result.stdout  # the job's stderr passes through too
    with store.transaction() as s:
        rows = list(s.scalars(select(ProgressRow).order_by(ProgressRow.id)))
    # At most one report every 5 s, plus the last one at exit: the job's last step always arrives.
    assert rows and rows[-1].step == 30 and rows[-1].total == 30
    assert len(rows) <= 3
    assert all(started <= r.at for r in rows)
