"""A job sharing its GPU: NVIDIA MPS on the node, and the variables that cap the job's share.

The broker tells the agent a job holds a fraction of its GPU with ``BROKER_GPU_SHARE`` (0.5 for
``A100:0.5``) and the GPU memory it may pin with ``BROKER_GPU_MEMORY_MB``. Jobs sharing a GPU get
the same ``CUDA_VISIBLE_DEVICES`` whatever the node has. Where the node has NVIDIA MPS
(``nvidia-cuda-mps-control`` on the PATH), the agent starts its control daemon once per node (the
first agent to come starts it, under a lock, the others find its pid file) and gives the job, as
NVIDIA documents them:

- ``CUDA_MPS_PIPE_DIRECTORY`` and ``CUDA_MPS_LOG_DIRECTORY``: the daemon's, so the job's CUDA
  context reaches it (``/tmp/nvidia-mps`` and ``/var/log/nvidia-mps`` unless the node sets them);
- ``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE``: the share in percent of the GPU's SMs;
- ``CUDA_MPS_PINNED_DEVICE_MEM_LIMIT``: ``0=<MB>MB`` (device 0 is the one GPU the job sees).

The daemon is started without ``CUDA_VISIBLE_DEVICES``: started with it, MPS renumbers the
devices and a client keeping its own list would fail. A job may turn MPS off with
``BROKER_MPS: "off"`` in its ``envs`` (the broker then sends ``BROKER_GPU_MPS=off``; the job
shares its GPU by time-slicing, as on a node without MPS).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import subprocess
import time
from collections.abc import Mapping
from pathlib import Path

from broker.errors import BrokerError

CONTROL = "nvidia-cuda-mps-control"
PID_FILE = "nvidia-cuda-mps-control.pid"
DEFAULT_PIPE_DIRECTORY = "/tmp/nvidia-mps"
DEFAULT_LOG_DIRECTORY = "/var/log/nvidia-mps"
START_TIMEOUT_S = 10.0


class MpsError(BrokerError, RuntimeError):
    pass


def _share(env: Mapping[str, str]) -> float | None:
    text = env.get("BROKER_GPU_SHARE", "").strip()
    if not text:
        return None
    try:
        share = float(text)
    except ValueError:
        raise MpsError(f"BROKER_GPU_SHARE: expected a fraction between 0 and 1, got {text[:40]!r}") from None
    if not 0 < share < 1:
        raise MpsError(f"BROKER_GPU_SHARE: expected a fraction between 0 and 1, got {text[:40]!r}")
    return share


def _running(pipe_directory: Path) -> bool:
    try:
        pid = int((pipe_directory / PID_FILE).read_text().strip())
        os.kill(pid, 0)
    except (OSError, ValueError):
        return False
    return True


def ensure_daemon(control: str, pipe_directory: Path, log_directory: Path, env: Mapping[str, str]) -> bool:
    """Start the MPS control daemon unless one runs for ``pipe_directory``; True if this call started it."""
    pipe_directory.mkdir(parents=True, exist_ok=True)
    log_directory.mkdir(parents=True, exist_ok=True)
    with open(pipe_directory / ".broker-start.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if _running(pipe_directory):
            return False
        daemon_env = {k: v for k, v in env.items() if k != "CUDA_VISIBLE_DEVICES"}
        daemon_env.update(CUDA_MPS_PIPE_DIRECTORY=str(pipe_directory), CUDA_MPS_LOG_DIRECTORY=str(log_directory))
        result = subprocess.run([control, "-d"], env=daemon_env, stdin=subprocess.DEVNULL,
                                capture_output=True, timeout=START_TIMEOUT_S, check=False)
        if result.returncode != 0:
            raise MpsError(f"{control} -d exited {result.returncode}: "
                           f"{result.stderr.decode(errors='replace').strip()[:200]}")
        deadline = time.time() + START_TIMEOUT_S
        while not _running(pipe_directory):
            if time.time() > deadline:
                raise MpsError(f"{control} -d started no daemon (no pid in {pipe_directory / PID_FILE})")
            time.sleep(0.05)
        return True


def share_env(env: Mapping[str, str]) -> dict[str, str]:
    """The MPS variables for a job holding a share of its GPU on a node with MPS; {} otherwise."""
    share = _share(env)
    if share is None or env.get("BROKER_GPU_MPS", "").lower() == "off":
        return {}
    control = shutil.which(CONTROL, path=env.get("PATH"))
    if control is None:
        return {}
    pipe = Path(env.get("CUDA_MPS_PIPE_DIRECTORY") or DEFAULT_PIPE_DIRECTORY)
    logs = Path(env.get("CUDA_MPS_LOG_DIRECTORY") or DEFAULT_LOG_DIRECTORY)
    ensure_daemon(control, pipe, logs, env)
    out = {"CUDA_MPS_PIPE_DIRECTORY": str(pipe), "CUDA_MPS_LOG_DIRECTORY": str(logs),
           "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": str(max(1, min(100, round(share * 100))))}
    memory = env.get("BROKER_GPU_MEMORY_MB", "").strip()
    with contextlib.suppress(ValueError):
        if memory and int(memory) > 0:
            out["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] = f"0={int(memory)}MB"
    return out
