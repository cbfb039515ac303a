"""The progress contract: how a job tells the broker how far it has got, without importing anything.

A job reports progress in any of three ways; the agent reads them all and reports the newest to
the broker (``POST /v1/progress``) at most every few seconds:

- a line ``BROKER_PROGRESS step=120 total=400`` on its output (``total`` may be left out);
- a ``tqdm`` bar on its output (``... | 120/400 [00:12<00:28, 9.8it/s]``): the ``N/M [`` counter;
- a JSON file at ``$BROKER_PROGRESS_FILE``: ``{"step": 120, "total": 400}``, rewritten as it goes.

The agent passes the job's output through unchanged.
"""

from __future__ import annotations

import json
import os
import re
import sys
import threading
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import IO, Any

from broker.agent.reporting import Events, LatestOnly, post_with_retry

MAX_STEP = 2**62
MAX_LINE_BYTES = 8192  # a longer line is passed through but not read for progress
MAX_FILE_BYTES = 4096
REPORT_EVERY_SECONDS = 5.0

_CONTRACT = re.compile(rb"BROKER_PROGRESS\s+step=(\d{1,19})(?:\s+total=(\d{1,19}))?")
_TQDM = re.compile(rb"(?<![\d/.])(\d{1,19})/(\d{1,19})\s*\[")


@dataclass(frozen=True, slots=True)
class Progress:
    step: int
    total: int | None = None

    @classmethod
    def checked(cls, step: object, total: object = None) -> Progress | None:
        """A Progress from untrusted values, or None when they are not a sane counter."""
        if not isinstance(step, int) or isinstance(step, bool) or not 0 <= step <= MAX_STEP:
            return None
        if total is not None and (not isinstance(total, int) or isinstance(total, bool)
                                  or not 0 < total <= MAX_STEP):
            return None
        return cls(step, total)


def parse_line(line: bytes) -> Progress | None:
    """Progress said on one line of output (the last counter on it wins: tqdm redraws in place)."""
    if len(line) > MAX_LINE_BYTES:
        return None
    found = _CONTRACT.findall(line)
    if found:
        step, total = found[-1]
        return Progress.checked(int(step), int(total) if total else None)
    counters = _TQDM.findall(line)
    if counters:
        step, total = counters[-1]
        return Progress.checked(int(step), int(total))
    return None


def read_progress_file(path: str | None) -> Progress | None:
    if not path:
        return None
    try:
        with open(path, "rb") as handle:
            raw = handle.read(MAX_FILE_BYTES + 1)
    except OSError:
        return None
    if len(raw) > MAX_FILE_BYTES:
        return None
    try:
        data = json.loads(raw)
    except ValueError:
        return None
    if not isinstance(data, dict):
        return None
    return Progress.checked(data.get("step"), data.get("total"))


class ProgressReporter:
    """Keeps the newest progress seen and reports it when it changed, at most every few seconds."""

    def __init__(self, broker_url: str | None, token: str | None, cluster_id: str, node: str,
                 job_id: str | None, events: Events, every_s: float = REPORT_EVERY_SECONDS) -> None:
        # Every rank runs the same steps: rank 0 speaks for the gang.
        self.url = broker_url.rstrip("/") + "/v1/progress" if broker_url and job_id and node == "0" else None
        self.token, self.cluster_id, self.node, self.job_id = token, cluster_id, node, job_id
        self.events = events
        self.every_s = every_s
        self.latest: Progress | None = None
        self._sent: Progress | None = None
        self._last_sent_at = 0.0
        self._lock = threading.Lock()
        self.sender = LatestOnly(self._send)

    def saw(self, progress: Progress | None) -> None:
        if progress is not None:
            with self._lock:
                self.latest = progress

    def tick(self, force: bool = False) -> None:
        """Called every poll: report the newest progress if it changed and the last report is old enough."""
        with self._lock:
            latest = self.latest
        if self.url is None or latest is None or latest == self._sent:
            return
        now = time.time()
        if not force and now - self._last_sent_at < self.every_s:
            return
        self._sent, self._last_sent_at = latest, now
        self.sender.offer({"job_id": self.job_id, "cluster_id": self.cluster_id, "node": self.node,
                           "step": latest.step, "total": latest.total, "at": datetime.now(UTC).isoformat()})

    def flush(self, timeout: float) -> None:
        self.tick(force=True)
        self.sender.flush(timeout)

    def _send(self, payload: dict[str, Any]) -> None:
        assert self.url is not None
        post_with_retry(self.url, self.token, payload, time.time() + 30.0, self.events, "progress",
                        step=payload["step"])


def pass_through(source: IO[bytes], reporter: ProgressReporter, sink: IO[bytes] | None = None) -> threading.Thread:
    """Copy the job's output to ours unchanged, reading each line (split on \\n or \\r) for progress."""
    out = sink if sink is not None else sys.stdout.buffer

    def pump() -> None:
        partial = b""
        fd = source.fileno()
        while True:
            chunk = os.read(fd, 65536)
            if not chunk:
                break
            out.write(chunk)
            out.flush()
            lines = re.split(rb"[\r\n]", partial + chunk)
            partial = lines.pop()[-MAX_LINE_BYTES - 1:]
            for line in lines:
                reporter.saw(parse_line(line))
        if partial:
            reporter.saw(parse_line(partial))

    thread = threading.Thread(target=pump, daemon=True)
    thread.start()
    return thread
