"""A stand-in for SkyPilot's API server and the clouds behind it, served over HTTP to ``sdk.py``.

It runs in the test's process, so its clusters outlive any broker: a replica that takes over from
a dead leader asks the same server and finds the clusters, the launches still running (by their
request ids) and the job queues the leader left. Each call is a request that runs in a thread
here; ``/get`` answers its result or SkyPilot's error by the class name in ``sky.exceptions``.

What the clouds do is the test's to say: ``hold(zone)`` keeps launches there waiting (``hold()``:
everywhere), ``refuse(zone)`` ends them with ``ResourcesUnavailableError`` (no capacity) or the
error named, ``notice(cluster)`` shows each node's metadata service the cloud's preemption notice
and reclaims the nodes when it runs out, ``reclaim(cluster)`` takes them at once,
``add_up_cluster(name)`` is a cluster SkyPilot runs that no broker here launched.

Two ways to run the nodes. With ``run_commands`` (the end-to-end tests) each node is local
processes beside its own metadata service (``nodes.py``): the task's ``setup`` runs at launch and
each ``exec``'s ``run`` after it, and a job ends as its processes do. Without (the engine's and the
provisioner's tests, in one process), the nodes run nothing: a job stays ``RUNNING`` in the
cluster's queue until the test ends it with ``finish_job``/``finish_jobs``, as the cloud's.

``sdk()`` is the client for one process (the SDK object the provisioner is given); ``broker
serve`` in another process loads ``tests.skystandin.sdk:sky`` and finds the server by
``$BROKER_SKY_STANDIN_URL``.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import signal
import threading
import time
import uuid
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qs, urlsplit

from tests.skystandin.nodes import NOTICE_SECONDS, Metadata, Node, notice_time, reclaim_later, wait_all

if TYPE_CHECKING:
    from tests.skystandin.sdk import StandInSky

EVERY_ZONE = "*"


class SkyError(Exception):
    """An error SkyPilot raises, by its class name in ``sky.exceptions``."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind


@dataclass
class Job:
    job_id: int
    name: str
    submitted_at: float
    task: dict[str, Any] = field(default_factory=dict)
    status: str = "RUNNING"
    end_at: float | None = None
    processes: list[Any] = field(default_factory=list)
    logs: list[Path] = field(default_factory=list)


@dataclass
class Cluster:
    name: str
    cloud: str
    region: str
    zone: str
    task: dict[str, Any]
    launched_at: float = field(default_factory=time.time)
    status: str = "INIT"
    ever_up: bool = False
    nodes: list[Node] = field(default_factory=list)
    jobs: list[Job] = field(default_factory=list)


@dataclass
class Request:
    call: str
    cluster: str = ""
    done: threading.Event = field(default_factory=threading.Event)
    result: Any = None
    error: SkyError | None = None
    worked: threading.Event = field(default_factory=threading.Event)  # its work returned (even if cancelled)


class SkyStandIn:
    def __init__(self, root: Path, launch_seconds: float = 0.5, run_commands: bool = True) -> None:
        self.root = root
        self.launch_seconds = launch_seconds
        self.run_commands = run_commands
        self.clusters: dict[str, Cluster] = {}
        self.gone: list[Cluster] = []  # torn down or reclaimed, with their job logs
        self.requests: dict[str, Request] = {}
        self.calls: list[tuple[str, str, dict[str, Any]]] = []  # (call, cluster, task) in order
        self.held: set[str] = set()
        self.refused: dict[str, tuple[str, str | None]] = {}  # zone -> (sky.exceptions class, message)
        self._ids = itertools.count(1)
        self._lock = threading.RLock()
        self._current = threading.local()  # the request the calling thread works on
        self._clients: list[StandInSky] = []
        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self._httpd.daemon_threads = True

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._httpd.server_address[1]}"

    def start(self) -> SkyStandIn:
        threading.Thread(target=self._httpd.serve_forever, daemon=True).start()
        return self

    def stop(self) -> None:
        self.held.clear()  # launches still waiting end (cancelled below), not linger
        with self._lock:
            for request in self.requests.values():
                if not request.done.is_set():
                    request.error = SkyError("RequestCancelled", "the API server stopped")
                    request.done.set()
        self._httpd.shutdown()
        self._httpd.server_close()
        for client in self._clients:
            client.close()
        with self._lock:
            for cluster in list(self.clusters.values()):
                self._take_down(cluster)

    def __enter__(self) -> SkyStandIn:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def sdk(self) -> StandInSky:
        """The SkyPilot SDK, as a process that talks to this server uses it."""
        from tests.skystandin.sdk import StandInSky

        client = StandInSky(self.url)
        self._clients.append(client)
        return client

    # ----------------------------------------------------------------- what the clouds do

    def hold(self, zone: str = EVERY_ZONE) -> None:
        self.held.add(zone)

    def release(self, zone: str = EVERY_ZONE) -> None:
        self.held.discard(zone)

    def refuse(self, zone: str, error: str = "ResourcesUnavailableError", message: str | None = None) -> None:
        """Launches in ``zone`` end with ``sky.exceptions.<error>`` (by default: no capacity there)."""
        self.refused[zone] = (error, message)

    def add_up_cluster(self, name: str, zone: str = "us-east-1a") -> None:
        """A cluster SkyPilot runs that no broker here launched (a user's own, or one a broker forgot)."""
        task = {"resources": {"infra": f"aws/{zone[:-1]}/{zone}"}}
        with self._lock:
            self.clusters[name] = Cluster(name, "aws", zone[:-1], zone, task, status="UP", ever_up=True)

    def finish_job(self, job_name: str, status: str) -> None:
        """The job named ends (or its state changes) in its cluster's queue."""
        with self._lock:
            for job in self._jobs():
                if job.name == job_name:
                    job.status, job.end_at = status, time.time()

    def finish_jobs(self, status: str = "SUCCEEDED") -> None:
        with self._lock:
            for job in self._jobs():
                job.status, job.end_at = status, time.time()

    def count(self, call: str) -> int:
        """How many requests of ``call`` (``launch``, ``exec``, ``down``, ...) were made."""
        with self._lock:
            return sum(1 for made, _, _ in self.calls if made == call)

    def _jobs(self) -> list[Job]:
        return [job for cluster in self.clusters.values() for job in cluster.jobs]

    def notice(self, name: str) -> float:
        """The preemption notice on every node of ``name``; returns the seconds of notice."""
        with self._lock:
            cluster = self.clusters[name]
            at = notice_time(cluster.cloud)
            for node in cluster.nodes:
                node.metadata.notice(at)
        reclaim_later(NOTICE_SECONDS[cluster.cloud], lambda: self.reclaim(name))
        return NOTICE_SECONDS[cluster.cloud]

    def reclaim(self, name: str) -> None:
        with self._lock:
            cluster = self.clusters.get(name)
            if cluster is not None:
                self._take_down(cluster)

    def launches(self) -> list[tuple[str, str]]:
        """(cluster name, zone) of every launch asked for, in order."""
        with self._lock:
            return [(name, str(task["resources"]["infra"]).split("/")[-1]) for call, name, task in self.calls
                    if call == "launch"]

    def job_logs(self, job_name: str, rank: int = 0) -> list[Path]:
        with self._lock:
            return [job.logs[rank] for c in [*self.gone, *self.clusters.values()] for job in c.jobs
                    if job.name == job_name and len(job.logs) > rank]

    # ----------------------------------------------------------------- the calls

    def submit(self, call: str, args: dict[str, Any]) -> str:
        request_id = str(uuid.uuid4())
        request = Request(call, str(args.get("cluster_name") or ""))
        with self._lock:
            self.requests[request_id] = request
            task = args.get("task") or {}
            self.calls.append((call, str(args.get("cluster_name", "")), task))

        def run() -> None:
            self._current.request = request
            result: Any = None
            error: SkyError | None = None
            try:
                result = getattr(self, f"_{call}")(**args)
            except SkyError as exc:
                error = exc
            except Exception as exc:  # a bug here must show in the broker's log, not hang it
                error = SkyError("SkyPilotException", f"stand-in failed: {exc!r}")
            with self._lock:
                if not request.done.is_set():  # a cancelled request keeps its RequestCancelled
                    request.result, request.error = result, error
                    request.done.set()
            request.worked.set()

        threading.Thread(target=run, name=f"standin-{call}", daemon=True).start()
        return request_id

    def answer(self, request_id: str, wait: float) -> dict[str, Any]:
        request = self.requests.get(request_id)
        if request is None:
            return {"done": True, "error": {"type": "RequestCancelled", "message": f"no request {request_id}"}}
        if not request.done.wait(wait):
            return {"done": False}
        if request.error is not None:
            return {"done": True, "error": {"type": request.error.kind, "message": str(request.error)}}
        return {"done": True, "call": request.call, "result": request.result}

    def _launch(self, task: dict[str, Any], cluster_name: str, **_: Any) -> list[Any]:
        where = str(task["resources"]["infra"]).split("/")
        cloud, region, zone = where[0], where[1], where[-1]
        time.sleep(self.launch_seconds)
        while zone in self.held or EVERY_ZONE in self.held:
            time.sleep(0.05)
        request: Request = self._current.request
        if request.done.is_set():  # cancelled (sky.api_cancel) while it waited: no cluster comes up
            return []
        with self._lock:
            existing = self.clusters.get(cluster_name)
            if existing is not None and existing.status == "UP":
                return [None, {"cluster_name": cluster_name}]
            if zone in self.refused:
                kind, message = self.refused[zone]
                raise SkyError(kind, message or
                               f"Failed to acquire resources in {zone} for {task['resources']['instance_type']}")
            cluster = Cluster(cluster_name, cloud, region, zone, task)
            self.clusters[cluster_name] = cluster
        nodes = [self._node(cluster, rank) for rank in range(int(task.get("num_nodes", 1)))]
        cluster.nodes = nodes
        if task.get("setup") and self.run_commands:
            logs = self.root / "logs" / cluster_name
            started = [n.start(task["setup"], dict(task.get("envs") or {}), logs / f"setup-{n.rank}.log")
                       for n in nodes]
            codes = wait_all(started, timeout=300)
            if any(codes):
                self._take_down(cluster)
                raise SkyError("CommandError", f"setup failed on {cluster_name}: exit codes {codes}")
        with self._lock:
            if self.clusters.get(cluster_name) is not cluster:
                raise SkyError("ClusterDoesNotExist", f"Cluster {cluster_name!r} went away while launching.")
            cluster.status, cluster.ever_up = "UP", True
        return [None, {"cluster_name": cluster_name}]

    def _node(self, cluster: Cluster, rank: int) -> Node:
        instance = f"i-{next(self._ids):017x}"
        mounts: dict[str, str] = {}
        copies: list[tuple[str, str]] = []
        for point, source in (cluster.task.get("file_mounts") or {}).items():
            if isinstance(source, dict):  # a bucket: its local directory stands for the mount
                bucket = str(source["source"]).split("://", 1)[1].strip("/").replace("/", "_")
                local = self.root / "buckets" / bucket
                local.mkdir(parents=True, exist_ok=True)
                mounts[point] = str(local)
            else:
                copies.append((point, str(source)))
        metadata = Metadata(cluster.cloud, instance)
        node = Node(rank, self.root / "nodes" / cluster.name / str(rank), int(cluster.task.get("num_nodes", 1)),
                    metadata.start() if self.run_commands else metadata, mounts)
        node.home.mkdir(parents=True, exist_ok=True)
        for point, source in copies:
            node.copy_in(point, source)
        if cluster.task.get("workdir"):
            node.copy_in("sky_workdir", str(cluster.task["workdir"]))
        return node

    def _exec(self, task: dict[str, Any], cluster_name: str, **_: Any) -> list[Any]:
        with self._lock:
            cluster = self.clusters.get(cluster_name)
            if cluster is None or cluster.status != "UP":
                raise SkyError("ClusterNotUpError", f"Cluster {cluster_name!r} is not up.")
            job = Job(len(cluster.jobs) + 1, str(task.get("name", "")), time.time(), task)
            cluster.jobs.append(job)
            if not self.run_commands:
                return [job.job_id, {"cluster_name": cluster_name}]
            env = {**(task.get("envs") or {}), **(task.get("secrets") or {})}
            logs = self.root / "logs" / cluster_name
            job.logs = [logs / f"job-{job.job_id}-{node.rank}.log" for node in cluster.nodes]
            job.processes = [node.start(str(task.get("run", "")), env, log)
                             for node, log in zip(cluster.nodes, job.logs, strict=True)]
        threading.Thread(target=self._watch, args=(job,), daemon=True).start()
        return [job.job_id, {"cluster_name": cluster_name}]

    def _watch(self, job: Job) -> None:
        codes = wait_all(job.processes)
        with self._lock:
            if job.status == "RUNNING":
                job.status = "SUCCEEDED" if not any(codes) else "FAILED"
            job.end_at = time.time()

    def _queue(self, cluster_name: str, **_: Any) -> list[dict[str, Any]]:
        with self._lock:
            cluster = self.clusters.get(cluster_name)
            if cluster is None:
                raise SkyError("ClusterDoesNotExist", f"Cluster {cluster_name!r} does not exist.")
            return [{"job_id": j.job_id, "job_name": j.name, "username": "broker", "user_hash": "abcd1234",
                     "submitted_at": j.submitted_at, "start_at": j.submitted_at, "end_at": j.end_at,
                     "resources": f"{len(cluster.nodes)}x", "status": j.status,
                     "log_path": str(j.logs[0]) if j.logs else ""}
                    for j in cluster.jobs]

    def _status(self, cluster_names: list[str] | None = None, **_: Any) -> list[dict[str, Any]]:
        with self._lock:
            return [{"name": c.name, "launched_at": int(c.launched_at), "status": c.status,
                     "handle": {"cached_cluster_info": {"instances": {n.metadata.instance_id: [] for n in c.nodes}}},
                     "autostop": 60, "to_down": True, "cluster_hash": c.name, "cluster_ever_up": c.ever_up,
                     "user_hash": "abcd1234", "user_name": "broker", "workspace": "default", "is_managed": False,
                     "nodes": len(c.nodes), "cloud": c.cloud, "region": c.region}
                    for c in self.clusters.values() if cluster_names is None or c.name in cluster_names]

    def _down(self, cluster_name: str, **_: Any) -> None:
        with self._lock:
            cluster = self.clusters.get(cluster_name)
            if cluster is None:
                raise SkyError("ClusterDoesNotExist", f"Cluster {cluster_name!r} does not exist.")
            self._take_down(cluster)

    def _cancel(self, cluster_name: str, job_ids: list[int] | None = None, **_: Any) -> list[int]:
        with self._lock:
            cluster = self.clusters.get(cluster_name)
            if cluster is None:
                raise SkyError("ClusterDoesNotExist", f"Cluster {cluster_name!r} does not exist.")
            cancelled = []
            for job in cluster.jobs:
                if job.job_id in (job_ids or []) and job.status == "RUNNING":
                    job.status = "CANCELLED"
                    cancelled.append(job.job_id)
                    for process in job.processes:
                        _kill(process)
            return cancelled

    def _api_cancel(self, request_ids: str, **_: Any) -> list[str]:
        with self._lock:
            request = self.requests.get(request_ids)
            if request is not None and not request.done.is_set():
                request.error = SkyError("RequestCancelled", f"Request {request_ids} cancelled")
                request.done.set()
        return [request_ids]

    def _take_down(self, cluster: Cluster) -> None:
        self.clusters.pop(cluster.name, None)
        for job in cluster.jobs:
            if job.status == "RUNNING":
                job.status = "CANCELLED"
        for node in cluster.nodes:
            node.kill()
        self.gone.append(cluster)

    # ----------------------------------------------------------------- HTTP

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        standin = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def _send(self, body: dict[str, Any]) -> None:
                data = json.dumps(body).encode()
                with contextlib.suppress(OSError):  # a client that went away (a killed broker) hears nothing
                    self.send_response(200)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)

            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)) or b"{}")
                self._send({"request_id": standin.submit(str(body["call"]), dict(body.get("args") or {}))})

            def do_GET(self) -> None:
                url = urlsplit(self.path)
                query = {k: v[0] for k, v in parse_qs(url.query).items()}
                self._send(standin.answer(query.get("request_id", ""), float(query.get("wait", "10"))))

            def log_message(self, format: str, *args: object) -> None:
                pass

        return Handler


def _kill(process: Any) -> None:
    if process.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
