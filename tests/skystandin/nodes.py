"""The nodes of a stand-in SkyPilot cluster: local processes, each beside its zone's metadata service.

A node is a directory (its ``$HOME``) and the processes SkyPilot runs there: the task's ``setup``
when the cluster comes up, each ``sky.exec``'s ``run`` after that, as ``bash`` in a session of its
own with the variables SkyPilot sets (``SKYPILOT_NODE_RANK``, ``SKYPILOT_NUM_NODES``, ...). Each node
has its own metadata service in its cloud's wire format (``tests/cloud_metadata.py``),
reached the way a cloud routes the link-local address: the node's ``http_proxy`` points at it, so
the agent's requests to ``169.254.169.254`` and ``metadata.google.internal`` land there, while
``no_proxy`` sends its reports to the broker directly.

Absolute mount points (``/broker-checkpoint``) cannot be made per process without root, so a
bucket mounted there is the bucket's local directory, and the task's text names that directory
instead: the same path on every node of every cluster that mounts the bucket, as on the clouds.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from email.utils import format_datetime
from pathlib import Path
from typing import Any

from tests.cloud_metadata import FakeAzureImds, FakeGce, FakeImds, azure_server, gce_server, imds_server

NOTICE_SECONDS = {"aws": 120.0, "gcp": 30.0, "azure": 30.0}


@dataclass
class Metadata:
    """One node's metadata service: the state its cloud's stand-in serves, and where."""

    cloud: str
    instance_id: str
    stack: contextlib.ExitStack = field(default_factory=contextlib.ExitStack)
    url: str = ""
    aws: FakeImds | None = None
    gce: FakeGce | None = None
    azure: FakeAzureImds | None = None

    def start(self) -> Metadata:
        if self.cloud == "aws":
            self.aws = FakeImds()
            self.url = self.stack.enter_context(imds_server(self.aws))
        elif self.cloud == "gcp":
            self.gce = FakeGce()
            self.gce.values["id"] = self.instance_id
            self.url = self.stack.enter_context(gce_server(self.gce))
        else:
            self.azure = FakeAzureImds(vm_name=self.instance_id)
            self.url = self.stack.enter_context(azure_server(self.azure))
        return self

    def notice(self, at: datetime) -> None:
        """The cloud's preemption notice, as its metadata service shows it."""
        if self.aws is not None:
            self.aws.action = {"action": "terminate", "time": at.strftime("%Y-%m-%dT%H:%M:%SZ")}
        elif self.gce is not None:
            self.gce.set("preempted", "TRUE")
        elif self.azure is not None:
            self.azure.preempt([self.azure.vm_name], format_datetime(at, usegmt=True))

    def stop(self) -> None:
        self.stack.close()


def _rewrite(text: str, mounts: dict[str, str]) -> str:
    for point, local in sorted(mounts.items(), key=lambda m: -len(m[0])):
        text = text.replace(point, local)
    return text


@dataclass
class Node:
    rank: int
    root: Path
    cluster_nodes: int
    metadata: Metadata
    mounts: dict[str, str]  # absolute mount point -> the local directory standing for it
    processes: list[subprocess.Popen[bytes]] = field(default_factory=list)

    @property
    def home(self) -> Path:
        return self.root / "home"

    def env(self, extra: dict[str, str]) -> dict[str, str]:
        python = Path(sys.executable).parent  # the image's Python (with numpy) and uv
        env = {"HOME": str(self.home), "PATH": f"{self.home}/.local/bin:{python}:/usr/local/bin:/usr/bin:/bin",
               "LANG": "C.UTF-8", "UV_PYTHON_DOWNLOADS": "never",
               "SKYPILOT_NODE_RANK": str(self.rank), "SKYPILOT_NUM_NODES": str(self.cluster_nodes),
               "SKYPILOT_NODE_IPS": "\n".join(["127.0.0.1"] * self.cluster_nodes),
               "http_proxy": self.metadata.url, "no_proxy": "127.0.0.1,localhost"}
        env.update({k: _rewrite(str(v), self.mounts) for k, v in extra.items()})
        return env

    def copy_in(self, destination: str, source: str) -> None:
        target = self.home / destination.removeprefix("~/") if destination.startswith("~/") else \
            self.home / destination
        target.parent.mkdir(parents=True, exist_ok=True)
        if Path(source).is_dir():
            shutil.copytree(source, target, dirs_exist_ok=True)
        else:
            shutil.copy2(source, target)

    def start(self, script: str, env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
        workdir = self.home / "sky_workdir"
        workdir.mkdir(parents=True, exist_ok=True)
        log.parent.mkdir(parents=True, exist_ok=True)
        with log.open("ab") as out:
            process = subprocess.Popen(["bash", "-c", _rewrite(script, self.mounts)], cwd=workdir,
                                       env=self.env(env), stdout=out, stderr=subprocess.STDOUT,
                                       stdin=subprocess.DEVNULL, start_new_session=True)
        self.processes.append(process)
        return process

    def kill(self) -> None:
        for process in self.processes:
            if process.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(process.pid, signal.SIGKILL)
        for process in self.processes:
            with contextlib.suppress(Exception):
                process.wait(timeout=5)
        self.metadata.stop()


def wait_all(processes: list[subprocess.Popen[bytes]], timeout: float | None = None) -> list[int]:
    deadline = None if timeout is None else time.monotonic() + timeout
    codes = []
    for process in processes:
        left = None if deadline is None else max(deadline - time.monotonic(), 0.1)
        codes.append(process.wait(timeout=left))
    return codes


def reclaim_later(seconds: float, reclaim: Any) -> threading.Timer:
    timer = threading.Timer(seconds, reclaim)
    timer.daemon = True
    timer.start()
    return timer


def notice_time(cloud: str) -> datetime:
    return datetime.now(UTC) + timedelta(seconds=NOTICE_SECONDS[cloud])
