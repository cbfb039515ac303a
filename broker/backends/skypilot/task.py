"""The SkyPilot task for one cluster and one job start, as a task-YAML mapping.

``cluster_task`` is what ``sky.launch`` brings up: the gang pinned to the chosen offer (cloud,
region, zone, instance type, spot or not), the spec's disk, image and other resource keys, the
user's file mounts and workdir, the checkpoint bucket mounted through SkyPilot storage, and a
``setup`` that installs the node agent before the user's own setup. ``job_task`` is what
``sky.exec`` runs on it: the job's ``run`` (written to a file on the node) wrapped in the node
agent, with the broker's checkpoint contract in ``envs`` and the agent's token in ``secrets``
(SkyPilot redacts secrets in its logs).

Both are plain mappings (``sky.Task.from_yaml_config`` takes them), so they print as YAML for
``--dryrun`` and are checked in tests without SkyPilot.
"""

from __future__ import annotations

import copy
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from broker.backends.base import ClusterInfo, JobLaunch
from broker.errors import UserError
from broker.spec.job import JobSpec, sky_task_config

# Where the checkpoint bucket is mounted on every node (the same on every cluster, so a path a
# job recorded before a migration names the same checkpoint on the replacement).
CHECKPOINT_MOUNT = "/broker-checkpoint"
# Node-local fallback when the checkpoint dir is not a bucket (under the node user's $HOME): it
# does not survive the node, so a migrated job restarts from its beginning.
LOCAL_CHECKPOINT_ROOT = "broker-checkpoints"
AGENT_VENV = "~/.broker-agent"
AGENT_WHEELS = "~/.broker-wheels"
AGENT_PYTHON = "3.11"
TOKEN_SECRET = "BROKER_AGENT_TOKEN"

# Resource keys taken from the job file as written; placement keys come from the offer instead.
_PINNED = frozenset({"cloud", "region", "zone", "infra", "instance_type", "accelerators", "use_spot",
                     "any_of", "ordered", "job_recovery", "spot_recovery"})
_BUCKET_SCHEMES = ("s3://", "gs://", "az://")


class CheckpointDirError(UserError, ValueError):
    pass


@dataclass(frozen=True)
class AgentPackage:
    """The agent wheel on this machine, and where nodes find it."""

    wheel: Path

    @property
    def remote(self) -> str:
        return f"{AGENT_WHEELS}/{self.wheel.name}"


def sky_cluster_name(prefix: str, cluster_id: str) -> str:
    return f"{prefix}{cluster_id}"


def infra(cluster: ClusterInfo) -> str:
    if cluster.cloud == "azure":
        return f"azure/{cluster.region}"  # SkyPilot places Azure VMs by region only
    return f"{cluster.cloud}/{cluster.region}/{cluster.zone}"


def split_bucket(url: str) -> tuple[str, str]:
    """A checkpoint URL as (the bucket as SkyPilot storage names it, the path inside it).

    SkyPilot mounts whole buckets only (MOUNT mode refuses a sub-path), so the bucket is mounted
    and the job's directory is that path under the mount. Azure is ``az://ACCOUNT/CONTAINER/...``.
    """
    if url.startswith("az://"):
        parts = url.removeprefix("az://").strip("/").split("/", 2)
        if len(parts) < 2 or not all(parts[:2]):
            raise CheckpointDirError(f"broker.checkpoint.dir: expected az://ACCOUNT/CONTAINER[/PATH], got {url!r}")
        return f"https://{parts[0]}.blob.core.windows.net/{parts[1]}", parts[2].strip("/") if len(parts) == 3 else ""
    scheme, rest = url.split("://", 1)
    bucket, _, path = rest.strip("/").partition("/")
    if not bucket:
        raise CheckpointDirError(f"broker.checkpoint.dir: expected {scheme}://BUCKET[/PATH], got {url!r}")
    return f"{scheme}://{bucket}", path.strip("/")


def is_bucket(url: str | None) -> bool:
    return bool(url) and str(url).startswith(_BUCKET_SCHEMES)


def node_checkpoint_dir(checkpoint_dir: str | None, job_id: str) -> str:
    """The job's checkpoint directory on a node, as a shell word (``$HOME`` expands there)."""
    if checkpoint_dir and is_bucket(checkpoint_dir):
        path = split_bucket(checkpoint_dir)[1]
        return shlex.quote(f"{CHECKPOINT_MOUNT}/{path}" if path else CHECKPOINT_MOUNT)
    return f'"$HOME"/{LOCAL_CHECKPOINT_ROOT}/{shlex.quote(job_id)}'


def node_resume_path(checkpoint_dir: str | None, resume_from: str | None) -> str:
    """A checkpoint the broker names inside a bucket (``s3://B/PATH/step-9``) as the nodes see it."""
    if not resume_from or not checkpoint_dir or not is_bucket(checkpoint_dir):
        return resume_from or ""
    prefix = checkpoint_dir.rstrip("/") + "/"
    if not resume_from.startswith(prefix):
        return resume_from
    path = split_bucket(checkpoint_dir)[1]
    base = f"{CHECKPOINT_MOUNT}/{path}" if path else CHECKPOINT_MOUNT
    return f"{base}/{resume_from.removeprefix(prefix)}"


def _accelerators(spec: JobSpec, cluster: ClusterInfo) -> dict[str, int] | None:
    for choice in spec.accelerators:
        if choice.count == cluster.gpus_per_node:
            return {choice.name: choice.count}
    return None  # the instance type implies them


def _resource_keys(spec: JobSpec, cluster: ClusterInfo) -> dict[str, Any]:
    written = spec.task_config.get("resources") or {}
    if not isinstance(written, dict):
        return {}
    keys = {k: copy.deepcopy(v) for k, v in written.items() if k not in _PINNED}
    for alternative in written.get("any_of") or written.get("ordered") or []:
        where = str(alternative.get("infra", cluster.cloud)) if isinstance(alternative, dict) else ""
        if isinstance(alternative, dict) and where.split("/")[0] == cluster.cloud:
            keys.update({k: copy.deepcopy(v) for k, v in alternative.items() if k not in _PINNED})
            break
    return keys


def agent_setup(agent: AgentPackage) -> str:
    """Install the agent in its own Python 3.11 venv (via uv), leaving the image's Python alone."""
    return "\n".join([
        "export PATH=$HOME/.local/bin:$PATH",
        "command -v uv >/dev/null 2>&1 || python3 -m pip install --quiet --user uv"
        " || curl -LsSf https://astral.sh/uv/install.sh | sh",
        f"[ -x {AGENT_VENV}/bin/python ] || uv venv --quiet --python {AGENT_PYTHON} {AGENT_VENV}",
        f"uv pip install --quiet --python {AGENT_VENV}/bin/python --no-deps --reinstall {agent.remote}",
    ])


def cluster_task(spec: JobSpec, cluster: ClusterInfo, agent: AgentPackage | None,
                 checkpoint_dir: str | None = None) -> dict[str, Any]:
    """The task ``sky.launch`` brings the gang up with (no ``run``: jobs start with ``sky.exec``)."""
    written = sky_task_config(spec)
    resources: dict[str, Any] = {"infra": infra(cluster), "instance_type": cluster.instance_type,
                                 "use_spot": cluster.spot, **_resource_keys(spec, cluster)}
    accelerators = _accelerators(spec, cluster)
    if accelerators:
        resources["accelerators"] = accelerators
    file_mounts: dict[str, Any] = copy.deepcopy(written.get("file_mounts") or {})
    checkpoint = checkpoint_dir if checkpoint_dir is not None else spec.broker.checkpoint.dir
    if is_bucket(checkpoint):
        file_mounts[CHECKPOINT_MOUNT] = {"source": split_bucket(str(checkpoint))[0], "mode": "MOUNT"}
    setup_parts: list[str] = []
    if agent is not None:
        file_mounts[agent.remote] = str(agent.wheel)
        setup_parts.append(agent_setup(agent))
    if spec.setup:
        setup_parts.append(spec.setup)
    task: dict[str, Any] = {"name": spec.name, "num_nodes": cluster.num_nodes, "resources": resources}
    if spec.workdir:
        workdir = spec.resolved_workdir()
        task["workdir"] = str(workdir) if workdir else spec.workdir
    if spec.envs:
        task["envs"] = dict(spec.envs)
    if file_mounts:
        task["file_mounts"] = file_mounts
    if setup_parts:
        task["setup"] = "\n".join(["set -e", *setup_parts])
    return task


def job_name(job_id: str, attempt: int) -> str:
    return f"{job_id}-{attempt}"


def agent_command(cluster: ClusterInfo, launch: JobLaunch) -> str:
    """The shell lines each node runs: the job's ``run`` written to a script file (an argument is
    limited to 128 KB, a job's ``run`` is not), then the node agent running that script.

    The agent reads its token from ``$BROKER_AGENT_TOKEN`` (a SkyPilot secret), not from its
    argument list, where every user of the node could see it in ``ps``.
    """
    signal_name = launch.spec.broker.checkpoint.signal
    # The wrapper shell ignores the checkpoint signal, so only job processes that handle it react.
    # A variable too long to export (see ``job_task``) is set in the script itself.
    own = "".join(f"{name}={shlex.quote(value)}\n" for name, value in launch.spec.envs.items()
                  if not exportable(name, value) and name.isidentifier())
    inner = f"trap '' {signal_name.removeprefix('SIG')}\n{own}{launch.spec.run}\n"
    script = f"{run_status_file(launch.job_id, launch.attempt)}.sh"
    words = [f"{AGENT_VENV}/bin/python", "-m", "broker.agent", "--cloud", "auto",
             "--signal", signal_name, "--cluster-id", cluster.id,
             "--status-file", run_status_file(launch.job_id, launch.attempt)]
    if launch.broker_url:
        words += ["--broker-url", launch.broker_url]
    line = " ".join(w if w.startswith("~/") else shlex.quote(w) for w in words)
    line += ' --checkpoint-dir "$BROKER_CHECKPOINT_DIR"'
    return (f"{heredoc(script, inner)}\n"
            f'{line} --node "$SKYPILOT_NODE_RANK" -- bash {script}')


# Linux's limit on one string of an exec's environment (MAX_ARG_STRLEN).
MAX_EXPORTED_BYTES = 128 * 1024


def exportable(name: str, value: str) -> bool:
    return len(name) + len(value) + 2 <= MAX_EXPORTED_BYTES


def heredoc(path: str, text: str) -> str:
    """Shell lines writing ``text`` to ``path`` verbatim (a quoted here-document: nothing expands)."""
    marker = "BROKER_RUN_EOF"
    while marker in text:
        marker += "_"
    return f"cat > {path} <<'{marker}'\n{text}{marker}"


def run_status_file(job_id: str, attempt: int) -> str:
    """Where the agent of one attempt writes its status, and its job's process group beside it."""
    return f"{AGENT_VENV}/runs/{job_name(job_id, attempt)}"


def signal_task(cluster: ClusterInfo, job_id: str, attempt: int, signal_name: str) -> dict[str, Any]:
    """A task that sends one attempt's job processes a signal on every node (in-cluster preemption)."""
    pgid = f"{run_status_file(job_id, attempt)}.pgid"
    # Through the agent's own check: a job that does not catch the signal yet would be killed by it.
    return {"name": f"signal-{job_name(job_id, attempt)}", "num_nodes": cluster.num_nodes,
            "run": f"[ -f {pgid} ] && {AGENT_VENV}/bin/python -m broker.agent.catching {pgid} "
                   f"{shlex.quote(signal_name)} || true"}


def _visible_devices(launch: JobLaunch) -> str:
    ranks = sorted(launch.placement.nodes)
    arms = " ".join(f"{rank}) export CUDA_VISIBLE_DEVICES={launch.placement.visible_devices(rank)};;"
                    for rank in ranks)
    return f'case "$SKYPILOT_NODE_RANK" in {arms} esac'


def _envs(launch: JobLaunch) -> dict[str, str]:
    return {
        # Linux refuses to exec anything whose environment holds one string over 128 KB: such a
        # variable goes into the run's script file instead (``agent_command``), unexported.
        **{name: value for name, value in launch.spec.envs.items() if exportable(name, value)},
        "BROKER_JOB_ID": launch.job_id,
        "BROKER_RESUME_FROM": node_resume_path(launch.checkpoint_dir, launch.resume_from),
        "BROKER_ATTEMPT": str(launch.attempt),
        **launch.share_env(),
    }


def setup_name(job_id: str, attempt: int) -> str:
    return f"{job_name(job_id, attempt)}-setup"


def _setup_lines(job_id: str, attempt: int, setup: str) -> str:
    """The job's setup as a script of its own (``sky.exec`` runs no task ``setup``), run in a shell of its own."""
    script = f"{run_status_file(job_id, attempt)}.setup.sh"
    body = f"set -e\n{setup}\n"
    return f"mkdir -p {AGENT_VENV}/runs\n{heredoc(script, body)}\nbash {script} || exit $?"


def setup_task(cluster: ClusterInfo, launch: JobLaunch) -> dict[str, Any]:
    """The task ``sky.exec`` runs for an early setup: the job's ``setup`` on every node, asking for no
    GPU, so SkyPilot's job queue runs it beside the gang that still holds them."""
    return {"name": setup_name(launch.job_id, launch.attempt), "num_nodes": cluster.num_nodes,
            "resources": {"infra": infra(cluster), "instance_type": cluster.instance_type, "use_spot": cluster.spot},
            "envs": _envs(launch), "run": _setup_lines(launch.job_id, launch.attempt, launch.spec.setup or "true")}


def job_task(cluster: ClusterInfo, launch: JobLaunch, setup: str | None = None) -> dict[str, Any]:
    """The task ``sky.exec`` starts: one attempt of the job, under the agent, on every node; ``setup``
    first when given (a cluster launched with another job's setup, and no early setup)."""
    spec = launch.spec
    node_dir = node_checkpoint_dir(launch.checkpoint_dir, launch.job_id)
    envs = _envs(launch)
    first = [_setup_lines(launch.job_id, launch.attempt, setup)] if setup else []
    run = "\n".join([_visible_devices(launch), *first, f"export BROKER_CHECKPOINT_DIR={node_dir}",
                     'mkdir -p "$BROKER_CHECKPOINT_DIR"', f"mkdir -p {AGENT_VENV}/runs",
                     agent_command(cluster, launch)])
    resources: dict[str, Any] = {"infra": infra(cluster), "instance_type": cluster.instance_type,
                                 "use_spot": cluster.spot}
    accelerators = _accelerators(spec, cluster)
    if accelerators:
        resources["accelerators"] = accelerators
    shared = next((c for c in spec.accelerators if launch.gpu_share is not None and c.fraction == launch.gpu_share),
                  None)
    if shared is not None:  # SkyPilot's own job queue then runs the jobs sharing a GPU side by side
        resources["accelerators"] = {shared.name: shared.fraction}
    task: dict[str, Any] = {"name": job_name(launch.job_id, launch.attempt), "num_nodes": cluster.num_nodes,
                            "resources": resources, "envs": envs, "run": run}
    if cluster.agent_token:
        task["secrets"] = {TOKEN_SECRET: cluster.agent_token}
    return task
