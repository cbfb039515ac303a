"""Start `broker serve` replicas as real processes, and wait on what they say."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, TypeVar

import httpx

from providers.base import SpotQuote
from providers.trace import write_trace

ROOT = Path(__file__).resolve().parents[3]
T = TypeVar("T")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def two_zone_trace(path: Path, cheap_lost_from: int = 15, cheap_lost_until: int = 90, ticks: int = 180) -> Path:
    """A V100 market: aws us-east-1a (cheap) loses its capacity from minute ``cheap_lost_from``; gcp keeps its."""
    start = datetime(2026, 1, 1, tzinfo=UTC)
    quotes = []
    for tick in range(ticks):
        when = start + timedelta(minutes=tick)
        lost = cheap_lost_from <= tick < cheap_lost_until
        quotes.append(SpotQuote("aws", "us-east-1", "us-east-1a", "p3.2xlarge", "V100", 1, 0.9, 3.06, when,
                                available_nodes=0 if lost else 2))
        quotes.append(SpotQuote("gcp", "us-central1", "us-central1-a", "n1-highmem-8", "V100", 1, 1.0, 2.95, when,
                                available_nodes=2))
    write_trace(path, quotes)
    return path


@dataclass
class Replica:
    name: str
    port: int
    process: subprocess.Popen[bytes]
    log: Path
    env: dict[str, str] = field(repr=False)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def lines(self) -> list[dict[str, Any]]:
        out = []
        for line in self.log.read_text(errors="replace").splitlines():
            try:
                out.append(json.loads(line))
            except ValueError:
                continue
        return out

    def health(self) -> dict[str, Any] | None:
        try:
            return httpx.get(f"{self.url}/v1/health", timeout=2).json()  # type: ignore[no-any-return]
        except httpx.HTTPError:
            return None

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


def start_replica(name: str, env: dict[str, str], directory: Path) -> Replica:
    port = free_port()
    log = directory / f"{name}.log"
    with log.open("wb") as handle:
        process = subprocess.Popen([sys.executable, "-m", "broker", "serve", "--port", str(port)], cwd=ROOT,
                                   env={**os.environ, **env}, stdout=handle, stderr=handle,
                                   stdin=subprocess.DEVNULL)
    replica = Replica(name, port, process, log, env)
    wait_for(lambda: replica.health(), timeout=60, what=f"{name} to serve (log: {log.read_text()[-2000:]})")
    return replica


def wait_for(probe: Callable[[], T | None], timeout: float, what: str, every: float = 0.1) -> T:
    deadline = time.time() + timeout
    while time.time() < deadline:
        value = probe()
        if value:
            return value
        time.sleep(every)
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")
