"""A provisioner that makes a cloud call only while its leader still holds the lease.

The service's engine talks to the cloud through this wrapper: every call first runs ``check``
(the lease holder's local view, which raises once the lease is released, lost or has run out on
this process's clock), so a leader that was told to stop, or woke from a stall, launches,
starts, signals or tears down nothing. It wraps any backend; it knows nothing of the lease.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from broker.backends.base import ClusterInfo, ClusterStatus, JobLaunch, Provisioner, RunStatus

log = logging.getLogger("broker.backends.fenced")


class FencedProvisioner:
    def __init__(self, inner: Provisioner, check: Callable[[], None]) -> None:
        self.inner = inner
        self.name = inner.name
        self._check = check

    def check(self, call: str = "call", cluster: ClusterInfo | None = None) -> None:
        self._check()
        # After the check, so a log at debug level lists every call that went out, in order.
        log.debug("cloud call: %s %s", call, cluster.id if cluster else "",
                  extra={"event": "cloud_call", "call": call})

    def launch(self, cluster: ClusterInfo) -> None:
        self.check("launch", cluster)
        self.inner.launch(cluster)

    def status(self, cluster: ClusterInfo) -> ClusterStatus:
        self.check("status", cluster)
        return self.inner.status(cluster)

    def statuses(self, clusters: list[ClusterInfo]) -> dict[str, ClusterStatus]:
        self.check("statuses")
        return self.inner.statuses(clusters)

    def start_job(self, cluster: ClusterInfo, launch: JobLaunch) -> None:
        self.check("start_job", cluster)
        self.inner.start_job(cluster, launch)

    def run_status(self, cluster: ClusterInfo, job_id: str, attempt: int) -> RunStatus:
        self.check("run_status", cluster)
        return self.inner.run_status(cluster, job_id, attempt)

    def run_statuses(self, runs: list[tuple[ClusterInfo, str, int]]) -> dict[tuple[str, int], RunStatus]:
        self.check("run_statuses")
        return self.inner.run_statuses(runs)

    def terminate(self, cluster: ClusterInfo) -> None:
        self.check("terminate", cluster)
        self.inner.terminate(cluster)

    def signal_job(self, cluster: ClusterInfo, job_id: str, attempt: int, signal_name: str) -> None:
        self.check("signal_job", cluster)
        self.inner.signal_job(cluster, job_id, attempt, signal_name)

    def stop_job(self, cluster: ClusterInfo, job_id: str, attempt: int) -> None:
        self.check("stop_job", cluster)
        self.inner.stop_job(cluster, job_id, attempt)

    def prepare_job(self, cluster: ClusterInfo, launch: JobLaunch) -> None:
        self.check("prepare_job", cluster)
        self.inner.prepare_job(cluster, launch)

    def prepare_status(self, cluster: ClusterInfo, job_id: str, attempt: int) -> RunStatus:
        self.check("prepare_status", cluster)
        return self.inner.prepare_status(cluster, job_id, attempt)

    def stop_prepare(self, cluster: ClusterInfo, job_id: str, attempt: int) -> None:
        self.check("stop_prepare", cluster)
        self.inner.stop_prepare(cluster, job_id, attempt)

    def __getattr__(self, name: str) -> Any:
        # Whatever else a backend offers: its methods are fenced too (a new cloud call cannot slip
        # past), plain attributes (its root, its world) pass through.
        value = getattr(self.inner, name)
        if not callable(value) or isinstance(value, type):
            return value

        def fenced(*args: Any, **kwargs: Any) -> Any:
            self.check(name)
            return value(*args, **kwargs)

        return fenced
