"""A job sharing its GPU: the MPS daemon started once per node, and the variables a job is given."""

from __future__ import annotations

import contextlib
import os
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest

from broker.agent import mps

# NVIDIA's control daemon at the boundary: ``-d`` leaves a daemon (a sleep) and writes its pid
# where the real one does; FAIL in the environment makes it refuse as a node without GPUs would.
FAKE = """\
#!/bin/bash
[ "$1" = "-d" ] || exit 3
if [ -n "$FAIL" ]; then echo "no CUDA-capable device" >&2; exit 1; fi
echo "started CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES-unset}" >> "$CUDA_MPS_PIPE_DIRECTORY/daemon.log"
sleep 600 >/dev/null 2>&1 &
echo $! > "$CUDA_MPS_PIPE_DIRECTORY/nvidia-cuda-mps-control.pid"
"""


@pytest.fixture
def node(tmp_path: Path) -> Iterator[dict[str, str]]:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    control = bin_dir / mps.CONTROL
    control.write_text(FAKE)
    control.chmod(0o755)
    pipes = tmp_path / "pipes"
    yield {"PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}", "CUDA_MPS_PIPE_DIRECTORY": str(pipes),
           "CUDA_MPS_LOG_DIRECTORY": str(tmp_path / "logs")}
    with contextlib.suppress(OSError, ValueError):
        os.kill(int((pipes / mps.PID_FILE).read_text()), signal.SIGTERM)


def test_a_share_gets_mps_and_the_daemon_starts_once_per_node(node: dict[str, str]) -> None:
    job = {**node, "BROKER_GPU_SHARE": "0.3", "BROKER_GPU_MEMORY_MB": "4096", "CUDA_VISIBLE_DEVICES": "3"}
    first = mps.share_env(job)
    second = mps.share_env({**job, "BROKER_GPU_SHARE": "0.7", "BROKER_GPU_MEMORY_MB": ""})
    assert first == {"CUDA_MPS_PIPE_DIRECTORY": node["CUDA_MPS_PIPE_DIRECTORY"],
                     "CUDA_MPS_LOG_DIRECTORY": node["CUDA_MPS_LOG_DIRECTORY"],
                     "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "30", "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": "0=4096MB"}
    assert second["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "70" and "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT" not in second
    # One daemon, started without the job's device list (MPS would renumber the devices).
    log = Path(node["CUDA_MPS_PIPE_DIRECTORY"]) / "daemon.log"
    assert log.read_text().splitlines() == ["started CUDA_VISIBLE_DEVICES=unset"]


def test_whole_gpus_no_mps_on_the_node_or_mps_turned_off_get_nothing(node: dict[str, str]) -> None:
    assert mps.share_env(node) == {}  # whole GPUs
    assert mps.share_env({"PATH": "/nonexistent", "BROKER_GPU_SHARE": "0.5"}) == {}
    assert mps.share_env({**node, "BROKER_GPU_SHARE": "0.5", "BROKER_GPU_MPS": "off"}) == {}
    assert not (Path(node["CUDA_MPS_PIPE_DIRECTORY"]) / "daemon.log").exists()


@pytest.mark.parametrize("share", ["half", "1.5", "0", "-0.5", "nan", "0.5\x00", "9" * 5000])
def test_a_bad_share_is_one_line_naming_the_variable(node: dict[str, str], share: str) -> None:
    with pytest.raises(mps.MpsError) as caught:
        mps.share_env({**node, "BROKER_GPU_SHARE": share})
    message = str(caught.value)
    assert message.startswith("BROKER_GPU_SHARE:") and "\n" not in message and len(message) < 200


def test_a_daemon_that_will_not_start_says_why(node: dict[str, str]) -> None:
    with pytest.raises(mps.MpsError, match="no CUDA-capable device"):
        mps.share_env({**node, "BROKER_GPU_SHARE": "0.5", "FAIL": "1"})


@pytest.mark.parametrize("share, why", [("0.5", "no CUDA-capable device"), ("lots", "BROKER_GPU_SHARE:")])
def test_the_agent_runs_the_job_without_mps_when_mps_fails(tmp_path: Path, node: dict[str, str], share: str,
                                                          why: str) -> None:
    import json
    import subprocess
    import sys

    status = tmp_path / "status"
    out = tmp_path / "env.txt"
    command = [sys.executable, "-m", "broker.agent", "--cloud", "local", "--poll", "50ms",
               "--status-file", str(status), "--", "bash", "-c", f"env | grep ^CUDA_MPS_ACTIVE > {out}; exit 0"]
    env = {**os.environ, **node, "BROKER_GPU_SHARE": share, "FAIL": "1"}
    assert subprocess.run(command, env=env, timeout=60, check=False).returncode == 0
    assert out.read_text() == ""  # ran, without an MPS share
    events = [json.loads(line) for line in Path(f"{status}.events").read_text().splitlines()]
    failed = [e for e in events if e["event"] == "mps_unavailable"]
    assert len(failed) == 1 and why in failed[0]["reason"]
