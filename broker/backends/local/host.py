"""The local cloud's side of one cluster: ``python -m broker.backends.local.host CLUSTER_DIR``.

It plays what a real cloud does, independently of the broker (so a killed broker changes
nothing here): it refuses a spot launch the trace has no capacity for, brings the nodes up after
a provisioning delay, serves each node's instance metadata in the AWS IMDSv2 format, posts the
spot interruption notice two minutes (scaled by the clock) before the trace takes the capacity
away, and then kills every process on the nodes. A ``terminate`` file in the directory (or
SIGTERM) tears the cluster down. An ``interrupt`` file asks for a spot interruption now, whatever
the trace says, as AWS FIS's ``send-spot-instance-interruptions`` does: the notice at once, the
nodes taken two minutes (scaled by the clock) later.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import math
import os
import secrets
import signal
import sys
import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from broker.clock import AcceleratedClock
from providers.base import OfferKey
from providers.local import NOTICE_SECONDS, LocalMarket
from providers.trace import read_trace

TICK_WALL_SECONDS = 0.05
# How often a spot cluster re-reads its zone's other clusters (their ends move its preemption later).
ZONE_CHECK_WALL_SECONDS = 0.5
LIVE_STATES = ("PROVISIONING", "UP")


def write_json(path: Path, data: dict[str, Any]) -> None:
    # Per thread, not per process: two threads of one broker may write the same file at once.
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}")
    tmp.write_text(json.dumps(data, default=str))
    os.replace(tmp, path)


def read_json(path: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def kill_node_processes(directory: Path) -> int:
    """SIGKILL every process group recorded under the cluster directory; returns how many."""
    killed = 0
    for pid_file in [*directory.glob("procs/*"), *directory.glob("**/*.pgid")]:
        try:
            pgid = int(pid_file.read_text().strip())
        except (OSError, ValueError):
            continue
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pgid, signal.SIGKILL)
            killed += 1
    return killed


def process_alive(pid: object) -> bool:
    try:
        os.kill(int(str(pid)), 0)
    except (ProcessLookupError, ValueError):
        return False
    except PermissionError:
        return True
    try:  # a zombie has exited
        return "Z" not in Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0]
    except OSError:
        return True


@contextlib.contextmanager
def zone_lock(root: Path) -> Iterator[None]:
    """One host at a time decides whether the zone has room (hosts are separate processes)."""
    # Beside the clusters' directories, not among them (everything there is a cluster).
    with open(root.parent / "capacity.lock", "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def claimed_before(root: Path, key: dict[str, Any], me: Path, my_claim: tuple[float, str] | None) -> int:
    """Spot nodes of the zone's live clusters that claimed capacity before ``my_claim`` (all when None)."""
    nodes = 0
    for other in root.iterdir():
        if other == me or not other.is_dir():
            continue
        config, status = read_json(other / "cluster.json"), read_json(other / "status.json")
        if config is None or status is None or not config.get("spot") or config.get("key") != key:
            continue
        if status.get("state") not in LIVE_STATES or "claimed_wall" not in status:
            continue
        if my_claim is not None and (float(status["claimed_wall"]), other.name) >= my_claim:
            continue
        if process_alive(status.get("host_pid")):
            nodes += int(config.get("num_nodes", 0))
    return nodes


class MetadataState:
    def __init__(self) -> None:
        self.tokens: set[str] = set()
        self.notice: dict[str, str] | None = None
        self.instance_id = ""


def metadata_handler(state: MetadataState) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, format: str, *args: Any) -> None:
            pass

        def _send(self, status: int, body: str, content_type: str = "text/plain") -> None:
            data = body.encode()
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_PUT(self) -> None:
            if self.path != "/latest/api/token":
                self._send(404, "Not Found")
                return
            ttl = self.headers.get("X-aws-ec2-metadata-token-ttl-seconds")
            if not ttl or not ttl.isdigit() or not 1 <= int(ttl) <= 21600:
                self._send(400, "Bad Request")
                return
            token = secrets.token_urlsafe(32)
            state.tokens.add(token)
            self._send(200, token)

        def do_GET(self) -> None:
            if self.headers.get("X-aws-ec2-metadata-token") not in state.tokens:
                self._send(401, "Unauthorized")
                return
            if self.path == "/latest/meta-data/spot/instance-action" and state.notice is not None:
                self._send(200, json.dumps(state.notice), "application/json")
            elif self.path == "/latest/meta-data/instance-id":
                self._send(200, state.instance_id)
            else:
                self._send(404, "Not Found")

    return Handler


class ClusterHost:
    def __init__(self, directory: Path) -> None:
        self.dir = directory
        config = read_json(directory / "cluster.json")
        if config is None:
            raise SystemExit(f"{directory}/cluster.json missing or unreadable")
        self.config = config
        self.clock = AcceleratedClock(config["wall_origin"], config["speed"])
        trace = read_trace(config["trace"])
        self.market = LocalMarket(trace, self.clock.origin)
        self.key = OfferKey(**config["key"])
        self.nodes = int(config["num_nodes"])
        self.status: dict[str, Any] = {"state": "PROVISIONING", "host_pid": os.getpid()}
        self.metadata = MetadataState()
        self.metadata.instance_id = f"i-{config['cluster_id']}"
        self.stop = threading.Event()

    def save(self, **changes: Any) -> None:
        self.status.update(changes)
        write_json(self.dir / "status.json", self.status)

    def serve_metadata(self) -> int:
        server = ThreadingHTTPServer(("127.0.0.1", 0), metadata_handler(self.metadata))
        server.daemon_threads = True
        threading.Thread(target=server.serve_forever, daemon=True).start()
        return int(server.server_address[1])

    def end(self, reason: str) -> None:
        kill_node_processes(self.dir)
        self.save(state="TERMINATED", reason=reason, ended_wall=time.time())

    def claim(self, launched: datetime) -> bool:
        """Take room for the nodes in the zone, counting every live spot cluster there: the trace's
        ``available_nodes`` is the zone's, not each cluster's."""
        with zone_lock(self.dir.parent):
            have = self.market.available(self.key, launched)
            taken = claimed_before(self.dir.parent, self.config["key"], self.dir, None)
            if have - taken < self.nodes:
                self.save(state="FAILED", capacity_error=True,
                          reason=f"InsufficientInstanceCapacity: {max(0, have - taken)} of {self.nodes} spot nodes "
                                 f"available in {self.key.zone} ({taken} of its {have} in use)")
                return False
            self.save(state="PROVISIONING", claimed_wall=time.time())
            return True

    def preemption(self, launched: datetime) -> datetime | None:
        """When the trace leaves too little room for this cluster after the older ones in its zone."""
        older = claimed_before(self.dir.parent, self.config["key"], self.dir,
                               (float(self.status["claimed_wall"]), self.dir.name))
        return self.market.preemption_time(self.key, older + self.nodes, launched)

    def run(self) -> None:
        signal.signal(signal.SIGTERM, lambda *_: self.stop.set())
        launched = self.clock.now()
        spot = bool(self.config["spot"])
        if spot and not self.claim(launched):
            return
        port = self.serve_metadata()
        up_at = launched + timedelta(seconds=float(self.config["provision_seconds"]))
        preempt_at = self.preemption(launched) if spot else None
        if preempt_at is not None and preempt_at <= up_at:
            self.save(state="FAILED", capacity_error=True,
                      reason=f"capacity in {self.key.zone} was reclaimed while the nodes were starting")
            return
        self.save(state="PROVISIONING", metadata_port=port)
        notice_at = preempt_at - timedelta(seconds=NOTICE_SECONDS) if preempt_at else None
        checked = time.time()
        while not self.stop.is_set():
            now = self.clock.now()
            if spot and self.metadata.notice is None and time.time() - checked > ZONE_CHECK_WALL_SECONDS:
                # Older clusters that ended leave room: the preemption can only move later.
                checked = time.time()
                preempt_at = self.preemption(launched)
                notice_at = preempt_at - timedelta(seconds=NOTICE_SECONDS) if preempt_at else None
            if (self.dir / "terminate").exists():
                self.end("terminated on request")
                return
            if spot and self.metadata.notice is None and (self.dir / "interrupt").exists():
                preempt_at, notice_at = now + timedelta(seconds=NOTICE_SECONDS), now
            if self.status["state"] == "PROVISIONING" and now >= up_at:
                self.save(state="UP", up_wall=self.clock.to_wall(up_at),
                          node_ips=["127.0.0.1"] * self.nodes)
            if notice_at is not None and preempt_at is not None and now >= notice_at \
                    and self.metadata.notice is None:
                # IMDS gives whole seconds; round down so a job never plans on time it does not have.
                action = datetime.fromtimestamp(math.floor(self.clock.to_wall(preempt_at)), UTC)
                self.metadata.notice = {"action": "terminate", "time": action.strftime("%Y-%m-%dT%H:%M:%SZ")}
                self.save(notice_wall=time.time(), notice_action_wall=action.timestamp())
            if preempt_at is not None and now >= preempt_at:
                self.end(f"spot capacity reclaimed in {self.key.zone}")
                return
            time.sleep(TICK_WALL_SECONDS)
        self.end("terminated on request")


def main() -> None:
    ClusterHost(Path(sys.argv[1])).run()


if __name__ == "__main__":
    main()
