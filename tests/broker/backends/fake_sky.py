"""A stand-in for SkyPilot 0.14's client SDK, at the API server boundary.

Like the real SDK, every call returns a request id at once and the work happens on the "server"
(a thread here); ``get`` blocks until the request finishes and returns its result or raises the
error SkyPilot would (the real ``sky.exceptions`` classes). Clusters and their job queues live
in the fake's memory, shared by every provisioner pointed at it, as SkyPilot's state outlives a
broker restart.
"""

from __future__ import annotations

import itertools
import threading
import time
import types
import uuid
from dataclasses import dataclass, field
from typing import Any


class FakeTask:
    """``sky.Task`` as far as the provisioner uses it: a task built from a YAML mapping."""

    def __init__(self, config: dict[str, Any]) -> None:
        self.config = config

    @classmethod
    def from_yaml_config(cls, config: dict[str, Any]) -> FakeTask:
        return cls(config)


@dataclass
class FakeCluster:
    name: str
    status: str = "INIT"
    launched_at: float = field(default_factory=time.time)
    instances: list[str] = field(default_factory=list)
    ever_up: bool = False
    task: dict[str, Any] = field(default_factory=dict)
    jobs: list[dict[str, Any]] = field(default_factory=list)


@dataclass
class FakeRequest:
    done: threading.Event = field(default_factory=threading.Event)
    result: Any = None
    error: BaseException | None = None
    cancelled: bool = False


class FakeSky:
    StatusRefreshMode = types.SimpleNamespace(NONE="NONE", AUTO="AUTO", FORCE="FORCE")
    Task = FakeTask

    def __init__(self, launch_seconds: float = 0.3) -> None:
        self.launch_seconds = launch_seconds
        self.clusters: dict[str, FakeCluster] = {}
        self.requests: dict[str, FakeRequest] = {}
        self.calls: list[tuple[str, str]] = []  # (call, cluster name)
        self.refuse_zones: dict[str, BaseException] = {}  # zone -> error its launches end with
        self.hang_launches = False
        self._ids = itertools.count(1)
        self._lock = threading.Lock()

    # ----------------------------------------------------------------- the request machinery

    def _request(self, call: str, name: str, work: Any, delay: float = 0.0) -> str:
        request_id = str(uuid.uuid4())
        request = FakeRequest()
        with self._lock:
            self.requests[request_id] = request
            self.calls.append((call, name))

        def run() -> None:
            if delay:
                time.sleep(delay)
            if request.cancelled:
                return
            try:
                request.result = work()
            except BaseException as exc:
                request.error = exc
            request.done.set()

        threading.Thread(target=run, daemon=True).start()
        return request_id

    def get(self, request_id: str) -> Any:
        request = self.requests[request_id]
        request.done.wait()
        if request.error is not None:
            raise request.error
        return request.result

    def api_cancel(self, request_ids: str, silent: bool = False) -> str:
        def cancel() -> list[str]:
            from sky import exceptions

            request = self.requests[request_ids]
            if not request.done.is_set():
                request.cancelled = True
                request.error = exceptions.RequestCancelled(f"Request {request_ids} cancelled")
                request.done.set()
            return [request_ids]

        return self._request("api_cancel", request_ids, cancel)

    # ----------------------------------------------------------------- cluster calls

    def launch(self, task: FakeTask, cluster_name: str, idle_minutes_to_autostop: int | None = None,
               down: bool = False, dryrun: bool = False) -> str:
        zone = str(task.config["resources"]["infra"]).split("/")[-1]
        with self._lock:
            cluster = self.clusters.setdefault(cluster_name, FakeCluster(cluster_name, task=task.config))

        def provision() -> tuple[int | None, dict[str, Any]]:
            if zone in self.refuse_zones:
                with self._lock:
                    self.clusters.pop(cluster_name, None)  # the gang came up whole or not at all
                raise self.refuse_zones[zone]
            while self.hang_launches:
                time.sleep(0.05)
            with self._lock:
                cluster.status, cluster.ever_up = "UP", True
                nodes = int(task.config.get("num_nodes", 1))
                cluster.instances = [f"i-{next(self._ids):017x}" for _ in range(nodes)]
            return None, {"cluster_name": cluster_name}

        return self._request("launch", cluster_name, provision, delay=self.launch_seconds)

    def status(self, cluster_names: list[str] | None = None, refresh: Any = None,
               all_users: bool = False) -> str:
        def records() -> list[dict[str, Any]]:
            with self._lock:
                return [{"name": c.name, "status": c.status, "launched_at": int(c.launched_at),
                         "cluster_ever_up": c.ever_up,
                         "handle": {"cached_cluster_info": {"instances": {i: [] for i in c.instances}}}}
                        for c in self.clusters.values() if cluster_names is None or c.name in cluster_names]

        return self._request("status", "*", records)

    def down(self, cluster_name: str, purge: bool = False) -> str:
        def tear_down() -> None:
            from sky import exceptions

            with self._lock:
                if self.clusters.pop(cluster_name, None) is None:
                    raise exceptions.ClusterDoesNotExist(f"Cluster {cluster_name!r} does not exist.")

        return self._request("down", cluster_name, tear_down)

    def exec(self, task: FakeTask, cluster_name: str) -> str:
        def submit() -> tuple[int, dict[str, Any]]:
            from sky import exceptions

            with self._lock:
                cluster = self.clusters.get(cluster_name)
                if cluster is None or cluster.status != "UP":
                    raise exceptions.ClusterNotUpError(f"Cluster {cluster_name!r} is not up.")
                job_id = len(cluster.jobs) + 1
                cluster.jobs.append({"job_id": job_id, "job_name": task.config["name"], "status": "RUNNING",
                                     "task": task.config})
            return job_id, {"cluster_name": cluster_name}

        return self._request("exec", cluster_name, submit)

    def queue(self, cluster_name: str, skip_finished: bool = False, all_users: bool = False) -> str:
        def jobs() -> list[dict[str, Any]]:
            from sky import exceptions

            with self._lock:
                cluster = self.clusters.get(cluster_name)
                if cluster is None:
                    raise exceptions.ClusterDoesNotExist(f"Cluster {cluster_name!r} does not exist.")
                return [dict(j) for j in cluster.jobs]

        return self._request("queue", cluster_name, jobs)

    def cancel(self, cluster_name: str, job_ids: list[int] | None = None, all: bool = False) -> str:
        def cancel_jobs() -> None:
            from sky import exceptions

            with self._lock:
                cluster = self.clusters.get(cluster_name)
                if cluster is None:
                    raise exceptions.ClusterDoesNotExist(f"Cluster {cluster_name!r} does not exist.")
                for job in cluster.jobs:
                    if (all or job["job_id"] in (job_ids or [])) and job["status"] in ("PENDING", "RUNNING"):
                        job["status"] = "CANCELLED"

        return self._request("cancel", cluster_name, cancel_jobs)

    # ----------------------------------------------------------------- what the cloud does

    def finish_job(self, job_name: str, status: str) -> None:
        with self._lock:
            for cluster in self.clusters.values():
                for job in cluster.jobs:
                    if job["job_name"] == job_name:
                        job["status"] = status

    def finish_jobs(self, status: str = "SUCCEEDED") -> None:
        with self._lock:
            for cluster in self.clusters.values():
                for job in cluster.jobs:
                    job["status"] = status

    def preempt(self, cluster_name: str) -> None:
        with self._lock:
            self.clusters.pop(cluster_name, None)

    def count(self, call: str) -> int:
        with self._lock:
            return sum(1 for c, _ in self.calls if c == call)
