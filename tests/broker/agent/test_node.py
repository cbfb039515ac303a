"""The agent as a real process: it runs the job, hears the notice, signals, waits, reports."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from tests.cloud_metadata import FakeImds, imds_server

JOB = """
import os, signal, sys, time
from pathlib import Path
d = Path(os.environ["BROKER_CHECKPOINT_DIR"])
flag = []
saved = 0
signal.signal(signal.SIGUSR1, lambda *_: flag.append(1))
(d / "ready").write_text("")  # the handler is in place: the test may send the notice
for step in range(1000):
    time.sleep(0.01)
    if flag:
        flag.clear()
        saved += 1
        (d / f"ckpt-{step}").write_text("x")
        (d / ".tmp").write_text(f"ckpt-{step}")
        os.replace(d / ".tmp", d / "LATEST")
    if saved == 2:
        break
sys.exit(3)
"""


@contextmanager
def broker_stub(status: int = 202) -> Iterator[tuple[str, list[dict[str, Any]]]]:
    """A stand-in for the broker's notice endpoint that records what agents post."""
    received: list[dict[str, Any]] = []

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, format: str, *args: Any) -> None:
            pass

        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers["Content-Length"]))
            received.append({"auth": self.headers.get("Authorization"), **json.loads(body)})
            self.send_response(status)
            self.send_header("Content-Length", "2")
            self.end_headers()
            self.wfile.write(b"{}")

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", received
    finally:
        server.shutdown()
        server.server_close()


def wait_until_ready(checkpoint_dir: Path, timeout: float = 30.0) -> None:
    """Until the job has its signal handler in place (a loaded machine starts Python slowly)."""
    until = time.time() + timeout
    while not (checkpoint_dir / "ready").exists() and time.time() < until:
        time.sleep(0.05)


def read_events(status: Path) -> list[dict[str, Any]]:
    """The agent's events so far (a line it is writing may be incomplete)."""
    events = []
    with contextlib.suppress(FileNotFoundError):
        for line in Path(str(status) + ".events").read_text().splitlines():
            with contextlib.suppress(json.JSONDecodeError):
                events.append(json.loads(line))
    return events


def wait_for_event(status: Path, kind: str, timeout: float = 60.0) -> None:
    until = time.time() + timeout
    while not any(e["event"] == kind for e in read_events(status)) and time.time() < until:
        time.sleep(0.05)
    assert any(e["event"] == kind for e in read_events(status)), f"no {kind} event"


def _run_agent(tmp_path: Path, metadata: str, broker: str | None, state: FakeImds, job_text: str = JOB,
               lead_s: float = 4.0, wrapper: list[str] | None = None,
               meanwhile: Callable[[Path], None] | None = None) -> tuple[int, list[dict]]:
    """The agent running ``job_text`` (under ``wrapper``, when given), a notice ``lead_s`` ahead."""
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    job = tmp_path / "job.py"
    job.write_text(job_text)
    status = tmp_path / "status"
    command = [sys.executable, "-m", "broker.agent", "--cloud", "aws", "--metadata-url", metadata,
               "--poll", "50ms", "--cluster-id", "c1",
               "--checkpoint-dir", str(ckpt), "--status-file", str(status)]
    if broker:
        command += ["--broker-url", broker]
    process = subprocess.Popen([*command, "--", *(wrapper or []), sys.executable, str(job)],
                               env={**os.environ, "BROKER_AGENT_TOKEN": "secret-token"})
    try:
        wait_until_ready(ckpt)
        state.action = {"action": "terminate",
                        "time": (datetime.now(UTC) + timedelta(seconds=lead_s)).strftime("%Y-%m-%dT%H:%M:%SZ")}
        if meanwhile is not None:
            meanwhile(status)
        code = process.wait(timeout=60)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(timeout=30)
    return code, read_events(status)


def test_notice_signals_job_waits_for_checkpoint_and_reports(tmp_path: Path) -> None:
    state = FakeImds()
    with imds_server(state) as metadata, broker_stub() as (broker, received):
        code, events = _run_agent(tmp_path, metadata, broker, state)
    kinds = [e["event"] for e in events]
    assert code == 3  # the job's own exit code passes through
    assert json.loads((tmp_path / "status").read_text())["exit_code"] == 3
    assert kinds.index("notice_seen") < kinds.index("signaled") < kinds.index("checkpoint_complete")
    # ... and a last checkpoint just before the deadline, so little work is lost.
    assert [e.get("last", False) for e in events if e["event"] == "checkpoint_complete"] == [False, True]
    signaled = next(e for e in events if e["event"] == "signaled")
    # The job is signalled first; the report to the broker goes after, and cannot hold the signal up.
    assert kinds.index("signaled") < kinds.index("reported")
    assert signaled["delay_s"] >= 0
    assert received and all(r["auth"] == "Bearer secret-token" and r["cluster_id"] == "c1" for r in received)
    with_checkpoint = [r for r in received if r["checkpoint"]]
    assert with_checkpoint and Path(with_checkpoint[0]["checkpoint"]).name.startswith("ckpt-")


def test_job_is_signalled_even_when_broker_is_down(tmp_path: Path) -> None:
    state = FakeImds()
    with imds_server(state) as metadata:
        code, events = _run_agent(tmp_path, metadata, "http://127.0.0.1:9", state)
    kinds = [e["event"] for e in events]
    assert code == 3
    assert "signaled" in kinds and "checkpoint_complete" in kinds and "reported" not in kinds
    assert "report_gave_up" in kinds


# A job still importing its framework: no handler for the checkpoint signal until it is told to go on.
SLOW_START = """
import os, signal, sys, time
from pathlib import Path
d = Path(os.environ["BROKER_CHECKPOINT_DIR"])
(d / "ready").write_text("")  # running, but no handler yet
while not (d / "go").exists():
    time.sleep(0.02)
flag = []
signal.signal(signal.SIGUSR1, lambda *_: flag.append(1))
for step in range(1000):
    time.sleep(0.01)
    if flag:
        flag.clear()
        (d / f"ckpt-{step}").write_text("x")
        (d / ".tmp").write_text(f"ckpt-{step}")
        os.replace(d / ".tmp", d / "LATEST")
        break
sys.exit(3)
"""


def test_a_job_without_its_handler_survives_a_notice(tmp_path: Path) -> None:
    def until_the_notice_gives_up(status: Path) -> None:
        wait_for_event(status, "checkpoint_missing")  # the whole notice went by: the job never caught it
        (tmp_path / "ckpt" / "go").write_text("")

    state = FakeImds()
    with imds_server(state) as metadata, broker_stub() as (broker, received):
        code, events = _run_agent(tmp_path, metadata, broker, state, SLOW_START, meanwhile=until_the_notice_gives_up)
    kinds = [e["event"] for e in events]
    assert code == 3  # not 138: the checkpoint signal's default action did not kill it
    assert "signaled" not in kinds
    missing = next(e for e in events if e["event"] == "handler_missing")
    assert missing["signal"] == "SIGUSR1" and missing["reason"] == "notice"
    assert kinds.index("notice_seen") < kinds.index("handler_missing") < kinds.index("checkpoint_missing")
    assert received and all(r["signaled_at"] is None and r["checkpoint"] is None for r in received)


def test_the_notice_signal_waits_for_the_handler_under_a_wrapper_shell(tmp_path: Path) -> None:
    # As the backends start a job: a shell that ignores the signal (inherited by the job, where it
    # would be lost) and stays the job's parent.
    def once_the_agent_waits(status: Path) -> None:
        wait_for_event(status, "handler_missing")
        (tmp_path / "ckpt" / "go").write_text("")

    state = FakeImds()
    wrapper = ["bash", "-c", 'trap "" USR1; "$@"; exit $?', "job"]
    with imds_server(state) as metadata, broker_stub() as (broker, received):
        code, events = _run_agent(tmp_path, metadata, broker, state, SLOW_START, lead_s=30.0, wrapper=wrapper,
                                  meanwhile=once_the_agent_waits)
    kinds = [e["event"] for e in events]
    assert code == 3
    signaled = next(e for e in events if e["event"] == "signaled")
    assert signaled["deferred"] is True
    assert kinds.index("handler_missing") < kinds.index("signaled") < kinds.index("checkpoint_complete")
    assert "checkpoint_missing" not in kinds
    with_checkpoint = [r for r in received if r["checkpoint"]]
    assert with_checkpoint and with_checkpoint[0]["signaled_at"] is not None
