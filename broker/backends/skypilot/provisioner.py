"""The SkyPilot backend: gangs launched, queried and torn down through the SkyPilot SDK.

SkyPilot 0.14's SDK answers every call with a request id; the result comes from ``sky.get``,
which blocks until the API server finishes the request. Each such wait runs in a daemon thread
here, so every method the engine calls returns at once: ``launch`` starts the request and
``status`` reports what the threads have learnt so far (a launch still running, its error, or
the cluster's state in the latest ``sky.status`` snapshot, itself refreshed in the background).

Cluster names are ``<prefix><cluster id>``. The launch's request id goes back to the engine in
``ClusterStatus.handle`` and so into the store, which lets a restarted broker wait on a launch
its predecessor started, adopt the clusters it knows, and tear down strays with the prefix.
Job starts are found again by name (``<job id>-<attempt>``) in the cluster's job queue.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from broker.backends.agent_wheel import build_agent_wheel
from broker.backends.base import ClusterInfo, ClusterPhase, ClusterStatus, JobLaunch, RunPhase, RunStatus
from broker.backends.skypilot.sdk import RUN_PHASES, Request, enum_name, instance_ids, record_field
from broker.backends.skypilot.task import (
    AgentPackage,
    cluster_task,
    job_name,
    job_task,
    setup_name,
    setup_task,
    signal_task,
    sky_cluster_name,
)
from broker.spec.job import JobSpec

log = logging.getLogger("broker.backends.skypilot.provisioner")

@dataclass(frozen=True)
class SkyPilotOptions:
    prefix: str = "broker-"
    launch_timeout_s: float = 1800.0
    call_timeout_s: float = 600.0
    refresh_s: float = 10.0
    idle_minutes_to_autostop: int | None = 60  # a safety net: a forgotten cluster goes down by itself


class SkyPilotProvisioner:
    name = "skypilot"

    def __init__(self, home: Path, specs: Callable[[str], JobSpec | None],
                 options: SkyPilotOptions | None = None, sdk: Any = None) -> None:
        self.home = home
        self.specs = specs
        self.options = options or SkyPilotOptions()
        self._sdk = sdk
        self._lock = threading.Lock()
        self._launches: dict[str, Request] = {}
        self._downs: dict[str, Request] = {}
        self._execs: dict[tuple[str, str], Request] = {}
        self._status: Request | None = None
        self._snapshot: dict[str, Any] | None = None  # cluster name -> sky.status record
        self._snapshot_at = 0.0
        self._queues: dict[str, Request] = {}
        self._queue_snapshots: dict[str, tuple[float, dict[str, Any]]] = {}
        self._ever_up: set[str] = set()
        # Clusters whose loss status() has told the engine. run_status reports a job LOST only after
        # that, so the engine has marked the cluster ended (and its zone avoided) before it replaces it.
        self._reported_gone: set[str] = set()

    # ----------------------------------------------------------------- the SDK boundary

    @property
    def sdk(self) -> Any:
        if self._sdk is None:
            import sky

            self._sdk = sky
        return self._sdk

    def _capacity_error(self, error: BaseException) -> bool:
        from sky import exceptions

        return isinstance(error, (exceptions.ResourcesUnavailableError, exceptions.ProvisionPrechecksError))

    def _missing_cluster(self, error: BaseException) -> bool:
        from sky import exceptions

        return isinstance(error, (exceptions.ClusterDoesNotExist, exceptions.ClusterNotUpError))

    def _submit(self, what: str, call: Callable[[], Any], request_id: str | None = None) -> Request:
        """Run ``call`` (which returns a request id, or None for nothing to wait on) and wait for the
        request's result, off the caller's thread."""
        request = Request(what, request_id=request_id)

        def work() -> None:
            try:
                if request.request_id is None:
                    request.request_id = call()
                if request.request_id is not None:
                    request.result = self.sdk.get(request.request_id)
            except BaseException as exc:  # the request's failure is its result
                if request.error is None:  # not past its time limit already (_expired cancels it: keep why)
                    request.error = exc
            finally:
                request.finished = time.monotonic()
                request.done.set()

        threading.Thread(target=work, name=f"sky-{what}", daemon=True).start()
        return request

    def _expired(self, request: Request, limit: float) -> bool:
        if request.done.is_set() or time.monotonic() - request.started < limit:
            return False
        request.error = TimeoutError(f"SkyPilot {request.what} took longer than {limit:.0f}s")
        request.done.set()
        if request.request_id is not None:
            threading.Thread(target=self._cancel, args=(request.request_id,), daemon=True).start()
        return True

    def _cancel(self, request_id: str) -> None:
        try:
            self.sdk.get(self.sdk.api_cancel(request_id, silent=True))
        except Exception as exc:  # cancelling is best effort
            log.warning("could not cancel SkyPilot request %s: %s", request_id, exc)

    # ----------------------------------------------------------------- snapshots

    def _refresh_status(self, force: bool = False) -> None:
        with self._lock:
            request = self._status
            if request is not None and not self._expired(request, self.options.call_timeout_s) \
                    and not request.done.is_set():
                return
            if request is not None:
                if request.error is None:
                    self._snapshot = {str(record_field(r, "name")): r for r in request.result or []}
                    self._snapshot_at = request.started  # it shows everything that finished before then
                else:
                    log.warning("sky status failed: %s", request.error)
                self._status = None
            stale = self._snapshot is None or time.monotonic() - self._snapshot_at >= self.options.refresh_s
            if force or stale:
                sdk = self.sdk
                self._status = self._submit("status", lambda: sdk.status(refresh=sdk.StatusRefreshMode.AUTO))

    def snapshot(self, wait: float = 0.0) -> dict[str, Any] | None:
        """The latest ``sky.status`` records by cluster name (None until the first arrives)."""
        self._refresh_status()
        if wait > 0 and self._status is not None:
            self._status.done.wait(wait)
            self._refresh_status()
        return self._snapshot

    # ----------------------------------------------------------------- the Provisioner protocol

    def cluster_name(self, cluster: ClusterInfo) -> str:
        return sky_cluster_name(self.options.prefix, cluster.id)

    def agent_package(self) -> AgentPackage:
        return AgentPackage(build_agent_wheel(self.home / "agent"))

    def task_for(self, cluster: ClusterInfo) -> dict[str, Any]:
        spec = self.specs(cluster.id)
        if spec is None:
            raise LookupError(f"no job spec for cluster {cluster.id}")
        return cluster_task(spec, cluster, self.agent_package())

    def launch(self, cluster: ClusterInfo) -> None:
        name = self.cluster_name(cluster)
        with self._lock:
            if name in self._launches and not self._launches[name].failed:
                return
            previous = cluster.handle.get("launch_request")
            if previous and name not in self._launches:
                # Launched by an earlier broker: wait on that request instead of starting another.
                self._launches[name] = self._submit("launch", lambda: previous, request_id=str(previous))
                return
            if name in self._launches:
                return  # failed: the engine moves on to the next offer; a failure is not retried here
        config = self.task_for(cluster)
        sdk = self.sdk

        def call() -> Any:
            task = sdk.Task.from_yaml_config(config)
            return sdk.launch(task, cluster_name=name, idle_minutes_to_autostop=self.options.idle_minutes_to_autostop,
                              down=True)

        with self._lock:
            self._launches.setdefault(name, self._submit("launch", call))

    def status(self, cluster: ClusterInfo) -> ClusterStatus:
        status = self._status_of(cluster)
        if status.phase in (ClusterPhase.TERMINATED, ClusterPhase.FAILED):
            self._reported_gone.add(self.cluster_name(cluster))
        return status

    def statuses(self, clusters: list[ClusterInfo]) -> dict[str, ClusterStatus]:
        """Every cluster's status from the same ``sky status`` snapshot: one query for the whole fleet."""
        return {cluster.id: self.status(cluster) for cluster in clusters}

    def _status_of(self, cluster: ClusterInfo) -> ClusterStatus:
        name = self.cluster_name(cluster)
        with self._lock:
            launch = self._launches.get(name)
            down = self._downs.get(name)
        handle: dict[str, Any] = {"sky_cluster": name}
        if launch is not None and launch.request_id:
            handle["launch_request"] = launch.request_id
        if down is not None and down.done.is_set() and (down.error is None or self._missing_cluster(down.error)):
            return ClusterStatus(ClusterPhase.TERMINATED, reason="torn down", ended_at=datetime.now(UTC),
                                 handle=handle)
        running = launch is not None and not launch.done.is_set()
        if running and not self._expired(launch, self.options.launch_timeout_s):  # type: ignore[arg-type]
            return ClusterStatus(ClusterPhase.PROVISIONING, handle=handle)
        if launch is not None and launch.error is not None:
            error = launch.error
            return ClusterStatus(ClusterPhase.FAILED, reason=f"{type(error).__name__}: {error}".strip()[:500],
                                 capacity_error=self._capacity_error(error), ended_at=datetime.now(UTC),
                                 handle=handle)
        snapshot = self.snapshot()
        if snapshot is None:
            return ClusterStatus(ClusterPhase.PROVISIONING, handle=handle)  # first sky.status still on its way
        record = snapshot.get(name)
        if record is None:
            if launch is None and not cluster.handle.get("launch_request"):
                return ClusterStatus(ClusterPhase.UNKNOWN)
            if launch is not None and self._snapshot_at < (launch.finished or 0.0):
                self._refresh_status(force=self._status is None)
                return ClusterStatus(ClusterPhase.PROVISIONING, handle=handle)  # snapshot older than the launch
            if launch is None:
                self.launch(cluster)  # adopt the earlier broker's launch request
                return ClusterStatus(ClusterPhase.PROVISIONING, handle=handle)
            return ClusterStatus(ClusterPhase.TERMINATED, reason="reclaimed: the cluster is gone from sky status",
                                 ended_at=datetime.now(UTC), handle=handle)
        state = enum_name(record_field(record, "status"))
        ids = instance_ids(record_field(record, "handle"))
        if ids:
            handle["instance_ids"] = ids
        launched = record_field(record, "launched_at")
        up_at = datetime.fromtimestamp(float(launched), UTC) if launched else None
        if state == "UP":
            self._ever_up.add(name)
            return ClusterStatus(ClusterPhase.UP, up_at=up_at, handle=handle)
        if state == "INIT" and name not in self._ever_up and not record_field(record, "cluster_ever_up", False):
            return ClusterStatus(ClusterPhase.PROVISIONING, handle=handle)
        # STOPPED, or INIT after having been up: SkyPilot saw a node of the gang go away.
        return ClusterStatus(ClusterPhase.TERMINATED, reason=f"reclaimed: SkyPilot reports the cluster {state}",
                             ended_at=datetime.now(UTC), handle=handle)

    def start_job(self, cluster: ClusterInfo, launch: JobLaunch) -> None:
        launched = self.specs(cluster.id)  # the cluster's own setup ran at its launch
        setup = None if launch.setup_done or (launched is not None and launched.setup == launch.spec.setup) \
            else launch.spec.setup
        self._exec(cluster, job_name(launch.job_id, launch.attempt), job_task(cluster, launch, setup))

    def prepare_job(self, cluster: ClusterInfo, launch: JobLaunch) -> None:
        if launch.spec.setup:
            self._exec(cluster, setup_name(launch.job_id, launch.attempt), setup_task(cluster, launch))

    def prepare_status(self, cluster: ClusterInfo, job_id: str, attempt: int) -> RunStatus:
        return self._run_status(cluster, setup_name(job_id, attempt))

    def stop_prepare(self, cluster: ClusterInfo, job_id: str, attempt: int) -> None:
        self._cancel_named(cluster, setup_name(job_id, attempt))

    def _exec(self, cluster: ClusterInfo, task_name: str, config: dict[str, Any]) -> None:
        name = self.cluster_name(cluster)
        key = (name, task_name)
        with self._lock:
            if key in self._execs and not self._execs[key].failed:
                return
        sdk = self.sdk

        def call() -> Any:
            # Started already (by this broker before a restart)? Then find it, do not start it twice.
            queue = sdk.get(sdk.queue(name, skip_finished=False, all_users=True))
            if any(str(record_field(j, "job_name")) == key[1] for j in queue or []):
                return None
            return sdk.exec(sdk.Task.from_yaml_config(config), cluster_name=name)

        with self._lock:
            self._execs[key] = self._submit("exec", call)

    def run_status(self, cluster: ClusterInfo, job_id: str, attempt: int) -> RunStatus:
        return self._run_status(cluster, job_name(job_id, attempt))

    def run_statuses(self, runs: list[tuple[ClusterInfo, str, int]]) -> dict[tuple[str, int], RunStatus]:
        """Each run's status from its cluster's latest background ``sky queue`` snapshot (``_queue``)."""
        return {(job_id, attempt): self.run_status(cluster, job_id, attempt) for cluster, job_id, attempt in runs}

    def _run_status(self, cluster: ClusterInfo, wanted: str) -> RunStatus:
        name = self.cluster_name(cluster)
        with self._lock:
            started = self._execs.get((name, wanted))
        if started is not None and started.failed and not self._missing_cluster(started.error):  # type: ignore[arg-type]
            return RunStatus(RunPhase.START_FAILED, reason=f"sky exec failed: {started.error}"[:500])
        jobs = self._queue(name)
        if jobs is not None and wanted in jobs:
            phase = RUN_PHASES.get(enum_name(record_field(jobs[wanted], "status")), RunPhase.RUNNING)
            if phase is RunPhase.SUCCEEDED:
                return RunStatus(phase, 0)
            if phase in (RunPhase.FAILED, RunPhase.START_FAILED):
                return RunStatus(RunPhase.LOST if self._gone(cluster) else phase, 1, "setup failed" if phase is
                                 RunPhase.START_FAILED else None)
            if self._gone(cluster):  # running when its queue was last read; the nodes have gone since
                return RunStatus(RunPhase.LOST)
            return RunStatus(phase)
        if self._gone(cluster):
            return RunStatus(RunPhase.LOST)
        if started is not None and not started.failed:
            return RunStatus(RunPhase.RUNNING)  # submitted; not in the queue snapshot yet
        return RunStatus(RunPhase.NOT_STARTED)

    def _gone(self, cluster: ClusterInfo) -> bool:
        return self.cluster_name(cluster) in self._reported_gone

    def _queue(self, name: str) -> dict[str, Any] | None:
        """The cluster's job queue by job name, from the latest background ``sky.queue``."""
        with self._lock:
            request = self._queues.get(name)
            taken = self._queue_snapshots.get(name)
            if request is not None and request.done.is_set():
                if request.error is None:
                    taken = (time.monotonic(), {str(record_field(j, "job_name")): j for j in request.result or []})
                    self._queue_snapshots[name] = taken
                del self._queues[name]
                request = None
            if request is None and (taken is None or time.monotonic() - taken[0] >= self.options.refresh_s):
                sdk = self.sdk
                self._queues[name] = self._submit("queue", lambda: sdk.queue(name, skip_finished=False,
                                                                             all_users=True))
        return taken[1] if taken else None

    def signal_job(self, cluster: ClusterInfo, job_id: str, attempt: int, signal_name: str) -> None:
        name, config, sdk = self.cluster_name(cluster), signal_task(cluster, job_id, attempt, signal_name), self.sdk
        self._submit("signal", lambda: sdk.exec(sdk.Task.from_yaml_config(config), cluster_name=name))

    def stop_job(self, cluster: ClusterInfo, job_id: str, attempt: int) -> None:
        self._cancel_named(cluster, job_name(job_id, attempt))

    def _cancel_named(self, cluster: ClusterInfo, wanted: str) -> None:
        name, sdk = self.cluster_name(cluster), self.sdk

        def call() -> Any:
            queue = sdk.get(sdk.queue(name, skip_finished=False, all_users=True))
            ids = [record_field(j, "job_id") for j in queue or [] if str(record_field(j, "job_name")) == wanted]
            return sdk.get(sdk.cancel(name, job_ids=ids)) if ids else None

        self._submit("cancel", call)

    def terminate(self, cluster: ClusterInfo) -> None:
        name = self.cluster_name(cluster)
        with self._lock:
            existing = self._downs.get(name)
            if existing is not None and not existing.failed:
                return
            if existing is not None and existing.error is not None and self._missing_cluster(existing.error):
                return
            launch = self._launches.get(name)
        if launch is not None and not launch.done.is_set() and launch.request_id:
            self._cancel(launch.request_id)  # a launch still running is stopped before the teardown
        sdk = self.sdk
        with self._lock:
            self._downs[name] = self._submit("down", lambda: sdk.down(name))

    # ----------------------------------------------------------------- after a restart

    def reconcile(self, known_cluster_ids: set[str], wait: float = 60.0) -> list[str]:
        """Tear down clusters with the broker's prefix that the store does not know; returns their names.

        Clusters the store knows need nothing here: ``status`` finds them in the snapshot (adopts
        them) and the engine carries on. Blocks up to ``wait`` seconds for ``sky.status``: call it
        from a thread, not from the engine's step.
        """
        snapshot = self.snapshot(wait=wait)
        if snapshot is None:
            return []
        known = {sky_cluster_name(self.options.prefix, c) for c in known_cluster_ids}
        strays = sorted(n for n in snapshot if n.startswith(self.options.prefix) and n not in known)
        sdk = self.sdk
        for name in strays:
            log.warning("tearing down %s: SkyPilot runs it but the broker's store does not know it", name)
            with self._lock:
                if name not in self._downs:
                    self._downs[name] = self._submit("down", lambda n=name: sdk.down(n))  # type: ignore[misc]
        return strays
