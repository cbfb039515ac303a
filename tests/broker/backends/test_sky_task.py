"""The node side of a SkyPilot task: the agent wheel installs and the generated run line works in bash."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from broker.backends.agent_wheel import build_agent_wheel
from broker.backends.base import ClusterInfo, JobLaunch
from broker.backends.skypilot.task import (
    CheckpointDirError,
    job_task,
    node_checkpoint_dir,
    node_resume_path,
    signal_task,
    split_bucket,
)
from broker.spec.job import parse_job_spec
from policies.gang import GangPlacement

REPO = Path(__file__).resolve().parents[3]
UV = Path(sys.executable).parent / "uv"


def test_agent_wheel_installs_without_dependencies_and_runs(tmp_path: Path) -> None:
    wheel = build_agent_wheel(tmp_path / "wheels")
    assert build_agent_wheel(tmp_path / "wheels") == wheel  # unchanged code: the same wheel, reused
    if not UV.exists():
        pytest.skip("uv is not beside the interpreter")
    target = tmp_path / "site"
    subprocess.run([str(UV), "pip", "install", "--quiet", "--no-deps", "--no-index", "--python", sys.executable,
                    "--target", str(target), str(wheel)], check=True, timeout=120)
    clean = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    done = subprocess.run([sys.executable, "-m", "broker.agent", "--cloud", "local", "--metadata-url",
                           "http://127.0.0.1:9", "--", sys.executable, "-c", "import sys; sys.exit(7)"],
                          cwd=tmp_path, env={**clean, "PYTHONPATH": str(target)}, capture_output=True, timeout=60)
    assert done.returncode == 7  # the installed agent ran the job and passed its exit code on


def test_run_line_wraps_the_job_in_the_agent_on_each_node(tmp_path: Path) -> None:
    spec = parse_job_spec("name: t\nnum_nodes: 2\nresources:\n  accelerators: V100:2\n"
                          "run: echo \"$CUDA_VISIBLE_DEVICES $BROKER_JOB_ID it's\" > \"$OUT\"\n", offline=True)
    cluster = ClusterInfo("j-1-c1", "aws", "us-east-1", "us-east-1a", "p3.8xlarge", 2, 2, True,
                          agent_token="s3cr3t-agent-token")
    launch = JobLaunch("j-1", 1, spec, GangPlacement("j-1-c1", ((0, (0, 1)), (1, (1,)))), "s3://b/run", None,
                       "http://127.0.0.1:9", str(tmp_path / "logs"))
    task = job_task(cluster, launch)
    assert "export BROKER_CHECKPOINT_DIR=/broker-checkpoint/run\n" in task["run"]
    venv = tmp_path / "home" / ".broker-agent" / "bin"
    venv.mkdir(parents=True)
    (venv / "python").symlink_to(sys.executable)
    out = tmp_path / "out.txt"
    # As SkyPilot runs it on node 1: its variables, the task's envs, the secret.
    env = {**os.environ, **task["envs"], "HOME": str(tmp_path / "home"), "PYTHONPATH": str(REPO),
           "SKYPILOT_NODE_RANK": "1", "BROKER_AGENT_TOKEN": "s3cr3t-agent-token", "OUT": str(out)}
    run = task["run"].replace("/broker-checkpoint/run", str(tmp_path / "ckpt")).replace(" --cloud auto",
                                                                                          " --cloud local")
    done = subprocess.run(["bash", "-c", run], env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert out.read_text().strip() == "1 j-1 it's"  # node 1's GPUs, and the job's own quoting intact
    assert "--token" not in task["run"] and "s3cr3t" not in task["run"]  # the agent reads $BROKER_AGENT_TOKEN


def _expand(word: str, home: Path) -> str:
    return subprocess.run(["bash", "-c", f"printf %s {word}"], env={"HOME": str(home)}, capture_output=True,
                          text=True, check=True).stdout


@pytest.mark.parametrize(("url", "bucket", "node_dir"), [
    ("s3://ckpt/team/run-1/", "s3://ckpt", "/broker-checkpoint/team/run-1"),
    ("gs://ckpt", "gs://ckpt", "/broker-checkpoint"),
    ("az://acct/container/run", "https://acct.blob.core.windows.net/container", "/broker-checkpoint/run"),
])
def test_checkpoint_buckets_mount_whole(url: str, bucket: str, node_dir: str) -> None:
    assert split_bucket(url)[0] == bucket
    assert _expand(node_checkpoint_dir(url, "j-1"), Path("/home/ubuntu")) == node_dir


@pytest.mark.parametrize(("url", "reported", "on_node"), [
    ("s3://ckpt/team/run-1/", "s3://ckpt/team/run-1/step-9.npz", "/broker-checkpoint/team/run-1/step-9.npz"),
    ("gs://ckpt", "gs://ckpt/step-9", "/broker-checkpoint/step-9"),
    ("az://acct/container/run", "az://acct/container/run/a/b", "/broker-checkpoint/run/a/b"),
    ("s3://ckpt/run", "/broker-checkpoint/run/step-3", "/broker-checkpoint/run/step-3"),  # a notice's node path
    ("/srv/ckpt", "/srv/ckpt/step-3", "/srv/ckpt/step-3"),
    ("s3://ckpt/run", None, ""),
])
def test_a_reported_bucket_checkpoint_resumes_from_the_mount(url: str, reported: str | None, on_node: str) -> None:
    assert node_resume_path(url, reported) == on_node


def test_a_local_checkpoint_dir_stays_on_the_node() -> None:
    assert _expand(node_checkpoint_dir("/srv/ckpt", "j-1"), Path("/home/ubuntu")) == \
        "/home/ubuntu/broker-checkpoints/j-1"


def test_bad_azure_checkpoint_url_names_the_field() -> None:
    with pytest.raises(CheckpointDirError, match=r"broker.checkpoint.dir: expected az://ACCOUNT/CONTAINER"):
        split_bucket("az://only-account")


def test_the_task_is_plain_data() -> None:
    spec = parse_job_spec("name: t\nrun: x\n", offline=True)
    cluster = ClusterInfo("c", "gcp", "us-central1", "us-central1-a", "n1-highmem-8", 1, 0, False)
    launch = JobLaunch("j", 1, spec, GangPlacement.whole_nodes("c", 1, 0), "/ckpt", None, None, "/logs")
    task = job_task(cluster, launch)
    assert json.loads(json.dumps(task)) == task  # SkyPilot sends tasks as YAML/JSON: nothing exotic inside
    assert task["resources"]["use_spot"] is False and "secrets" not in task


def test_a_1mb_run_reaches_the_node_as_a_file_not_an_argument(tmp_path: Path) -> None:
    marker_line = "echo done-BROKER_RUN_EOF > \"$OUT\""  # the here-document's marker inside the job's own text
    run = "\n".join(f"# {i:07d} " + "x" * 110 for i in range(9000)) + "\n" + marker_line + "\n"
    spec = dataclasses.replace(parse_job_spec("name: t\nresources:\n  accelerators: V100:1\nrun: 'true'\n",
                                              offline=True), run=run + 'echo "${#BIG} ${SMALL}" >> "$OUT"\n',
                               envs={"BIG": "y" * 300_000, "SMALL": "s"})
    cluster = ClusterInfo("j-2-c1", "aws", "us-east-1", "us-east-1a", "p3.2xlarge", 1, 1, True, agent_token="tok")
    launch = JobLaunch("j-2", 1, spec, GangPlacement("j-2-c1", ((0, (0,)),)), "/srv/ckpt", None, None,
                       str(tmp_path / "logs"))
    task = job_task(cluster, launch)
    assert len(run) > 1024 * 1024
    venv = tmp_path / "home" / ".broker-agent" / "bin"
    venv.mkdir(parents=True)
    (venv / "python").symlink_to(sys.executable)
    out = tmp_path / "out.txt"
    script = tmp_path / "task.sh"  # SkyPilot runs `run` as a script file too
    script.write_text(task["run"].replace(" --cloud auto", " --cloud local"))
    assert "BIG" not in task["envs"] and task["envs"]["SMALL"] == "s"  # exported by SkyPilot: none over 128 KB
    env = {**os.environ, **task["envs"], "HOME": str(tmp_path / "home"), "PYTHONPATH": str(REPO),
           "SKYPILOT_NODE_RANK": "0", "BROKER_AGENT_TOKEN": "tok", "OUT": str(out)}
    done = subprocess.run(["bash", str(script)], env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr[-2000:]
    assert out.read_text().split("\n")[:2] == ["done-BROKER_RUN_EOF", "300000 s"]


def test_a_fraction_asks_skypilot_for_its_share_and_tells_the_agent() -> None:
    spec = parse_job_spec("name: t\nresources:\n  accelerators: A100:0.5\nrun: x\n", offline=True)
    cluster = ClusterInfo("c", "gcp", "us-central1", "us-central1-a", "a2-highgpu-2g", 1, 2, True)
    launch = JobLaunch("j", 1, spec, GangPlacement("c", ((0, (1,)),)), "/ckpt", None, None, "/logs",
                       gpu_share=0.5, gpu_memory_mb=20480)
    task = job_task(cluster, launch)
    assert task["resources"]["accelerators"] == {"A100": 0.5}
    assert task["envs"]["BROKER_GPU_SHARE"] == "0.5" and task["envs"]["BROKER_GPU_MEMORY_MB"] == "20480"
    assert task["envs"]["BROKER_GPU_MPS"] == "auto"
    assert "0) export CUDA_VISIBLE_DEVICES=1;;" in task["run"]


def test_a_fraction_per_node_of_a_gang_asks_skypilot_for_it_on_every_node() -> None:
    # SkyPilot's job-queue example: a share of one GPU on each of two nodes; each node sees its own GPU.
    spec = parse_job_spec("name: t\nnum_nodes: 2\nresources:\n  accelerators: A100:0.5\nrun: x\n", offline=True)
    cluster = ClusterInfo("c", "gcp", "us-central1", "us-central1-a", "a2-highgpu-2g", 2, 2, True)
    launch = JobLaunch("j", 1, spec, GangPlacement("c", ((0, (1,)), (1, (0,)))), "/ckpt", None, None, "/logs",
                       gpu_share=0.5, gpu_memory_mb=20480)
    task = job_task(cluster, launch)
    assert task["num_nodes"] == 2 and task["resources"]["accelerators"] == {"A100": 0.5}
    assert "0) export CUDA_VISIBLE_DEVICES=1;; 1) export CUDA_VISIBLE_DEVICES=0;;" in task["run"]
    import sky

    sky.Task.from_yaml_config({k: v for k, v in task.items() if k != "secrets"})  # SkyPilot takes it as it is


HANDLER = """
import signal, sys, time
from pathlib import Path
signal.signal(signal.SIGUSR1, lambda *_: Path(sys.argv[1]).write_text("got"))
Path(sys.argv[1]).write_text("ready")
while Path(sys.argv[1]).read_text() != "got":
    time.sleep(0.02)
"""


def test_the_signal_task_sends_only_to_a_job_that_catches_it(tmp_path: Path) -> None:
    cluster = ClusterInfo("j-1-c1", "aws", "us-east-1", "us-east-1a", "p3.8xlarge", 1, 1, True)
    run = signal_task(cluster, "j-1", 1, "SIGUSR1")["run"]
    home = tmp_path / "home"
    venv = home / ".broker-agent" / "bin"
    venv.mkdir(parents=True)
    (venv / "python").symlink_to(sys.executable)
    (home / ".broker-agent" / "runs").mkdir()
    pgid_file = home / ".broker-agent" / "runs" / "j-1-1.pgid"
    env = {**os.environ, "HOME": str(home), "PYTHONPATH": str(REPO)}
    script, state = tmp_path / "handler.py", tmp_path / "state"
    script.write_text(HANDLER)
    no_handler = subprocess.Popen(["sleep", "60"], start_new_session=True)
    handler = subprocess.Popen([sys.executable, str(script), str(state)], start_new_session=True)
    try:
        pgid_file.write_text(str(no_handler.pid))
        done = subprocess.run(["bash", "-c", run], env=env, capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stderr
        assert "catches SIGUSR1 yet: not signalled" in done.stdout
        assert no_handler.poll() is None  # the default action would have killed it
        until = time.time() + 60
        while not (state.exists() and state.read_text()) and time.time() < until:
            time.sleep(0.05)
        pgid_file.write_text(str(handler.pid))
        done = subprocess.run(["bash", "-c", run], env=env, capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stderr
        assert handler.wait(timeout=60) == 0 and state.read_text() == "got"
    finally:
        for process in (no_handler, handler):
            process.kill()
            process.wait(timeout=30)
