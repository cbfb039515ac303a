"""The provisioner contract: what the engine asks of any backend (local, SkyPilot).

Every call is idempotent and returns promptly: ``launch`` starts bringing a cluster up and
``status`` reports how far it got, so a slow cloud never blocks the engine, and an engine re-run
after a crash can call anything again without starting a second cluster or a second job.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Protocol

from broker.spec.job import JobSpec
from policies.gang import GangPlacement


@dataclass(frozen=True, slots=True)
class ClusterInfo:
    id: str
    cloud: str
    region: str
    zone: str
    instance_type: str
    num_nodes: int
    gpus_per_node: int
    spot: bool
    agent_token: str | None = None
    handle: dict[str, Any] = field(default_factory=dict)


class ClusterPhase(enum.StrEnum):
    PROVISIONING = "PROVISIONING"
    UP = "UP"
    FAILED = "FAILED"  # never came up
    TERMINATED = "TERMINATED"  # was up, is gone (preempted, torn down, lost)
    UNKNOWN = "UNKNOWN"  # the backend has never heard of it


@dataclass(frozen=True, slots=True)
class ClusterStatus:
    phase: ClusterPhase
    reason: str | None = None
    capacity_error: bool = False
    up_at: datetime | None = None
    ended_at: datetime | None = None
    handle: dict[str, Any] = field(default_factory=dict)
    # A preemption notice the backend itself saw (the local cloud, a cloud's event stream).
    notice_action_at: datetime | None = None


class RunPhase(enum.StrEnum):
    NOT_STARTED = "NOT_STARTED"
    RUNNING = "RUNNING"
    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"
    LOST = "LOST"  # its nodes went away before it ended
    # It never got to the job's ``run``: its ``setup`` failed, or the node refused the start.
    START_FAILED = "START_FAILED"
    # A node of it has no process, and none will come, on nodes that are still up: the broker that
    # started it died between claiming the node and launching its process, or the node's agent died
    # before it reported how the job ended. Not the job's fault: the engine starts it again.
    NO_PROCESS = "NO_PROCESS"


@dataclass(frozen=True, slots=True)
class RunStatus:
    phase: RunPhase
    exit_code: int | None = None
    reason: str | None = None  # why a start failed, in a line


MPS_OFF = ("off", "0", "false", "no")  # a job's ``envs: BROKER_MPS`` that keeps it off NVIDIA MPS


@dataclass(frozen=True, slots=True)
class JobLaunch:
    """One start of a job on a cluster: the gang's GPUs and the checkpoint contract's variables."""

    job_id: str
    attempt: int
    spec: JobSpec
    placement: GangPlacement
    checkpoint_dir: str
    resume_from: str | None
    broker_url: str | None
    log_dir: str
    gpu_share: float | None = None  # the share of its GPU a fraction holds (A100:0.5 -> 0.5); None: whole GPUs
    gpu_memory_mb: int | None = None  # the GPU memory that share may pin, when known
    # Its ``setup`` already ran on these nodes ahead of the start (``Provisioner.prepare_job``): only ``run`` is left.
    setup_done: bool = False
    gpu_sampler: str | None = None  # the ``gpu_sampler`` setting: the agents' GPU reader instead of NVML
    gpu_idle_below: float = 0.10  # the ``gpu_idle_below`` setting: the agents count samples below it as idle

    def env(self, node_rank: int, node_ips: list[str]) -> dict[str, str]:
        """The variables node ``node_rank`` of the gang sees (its rank in the gang, not the cluster).

        The broker's checkpoint contract plus the variables SkyPilot gives a task.
        """
        gpus = self.placement.visible_devices(self.placement.nodes[node_rank])
        sampler = {"BROKER_GPU_SAMPLER": self.gpu_sampler} if self.gpu_sampler else {}
        return {
            **sampler,  # the job's own envs may name another
            **self.spec.envs,
            "BROKER_JOB_ID": self.job_id,
            "BROKER_CHECKPOINT_DIR": self.checkpoint_dir,
            "BROKER_RESUME_FROM": self.resume_from or "",
            "BROKER_ATTEMPT": str(self.attempt),
            "CUDA_VISIBLE_DEVICES": gpus,
            "SKYPILOT_NODE_RANK": str(node_rank),
            "SKYPILOT_NODE_IPS": "\n".join(node_ips),
            "SKYPILOT_NUM_NODES": str(len(node_ips)),
            "SKYPILOT_NUM_GPUS_PER_NODE": str(len(gpus.split(",")) if gpus else 0),
            "SKYPILOT_TASK_ID": f"{self.job_id}-{self.attempt}",
            "BROKER_GPU_IDLE_BELOW": f"{self.gpu_idle_below:g}",  # the broker's accounting, not the job's to set
            **self.share_env(),
        }

    def share_env(self) -> dict[str, str]:
        """What tells the node agent the job shares its GPU: the share, and the memory it may pin."""
        if self.gpu_share is None:
            return {}
        share = {"BROKER_GPU_SHARE": f"{self.gpu_share:g}",
                 "BROKER_GPU_MPS": "off" if self.spec.envs.get("BROKER_MPS", "").lower() in MPS_OFF else "auto"}
        return {**share, "BROKER_GPU_MEMORY_MB": str(self.gpu_memory_mb)} if self.gpu_memory_mb else share


class Provisioner(Protocol):
    name: str

    def launch(self, cluster: ClusterInfo) -> None: ...

    def status(self, cluster: ClusterInfo) -> ClusterStatus: ...

    def statuses(self, clusters: list[ClusterInfo]) -> dict[str, ClusterStatus]:
        """``status`` of every one of ``clusters`` (by id), in one call: what the backend knows of its
        whole fleet read once (one cloud query, one look at each host), not once per cluster."""
        ...

    def start_job(self, cluster: ClusterInfo, launch: JobLaunch) -> None: ...

    def run_status(self, cluster: ClusterInfo, job_id: str, attempt: int) -> RunStatus: ...

    def run_statuses(self, runs: list[tuple[ClusterInfo, str, int]]) -> dict[tuple[str, int], RunStatus]:
        """``run_status`` of every one of ``runs`` (cluster, job, attempt), by (job, attempt), in one call:
        what the runs share (a cluster's status, a process, a cloud query) looked at once."""
        ...

    def terminate(self, cluster: ClusterInfo) -> None: ...

    def signal_job(self, cluster: ClusterInfo, job_id: str, attempt: int, signal_name: str) -> None:
        """Ask a running job to checkpoint (what the agent does on a notice), for in-cluster preemption."""
        ...

    def stop_job(self, cluster: ClusterInfo, job_id: str, attempt: int) -> None:
        """Stop one job's processes on a cluster that stays up (its GPUs go to another gang)."""
        ...

    def prepare_job(self, cluster: ClusterInfo, launch: JobLaunch) -> None:
        """Run the job's ``setup`` on the nodes of ``launch.placement`` ahead of its start, beside the
        gang that still holds those GPUs (eager allocation); idempotent, returns at once."""
        ...

    def prepare_status(self, cluster: ClusterInfo, job_id: str, attempt: int) -> RunStatus:
        """How that early setup went: NOT_STARTED, RUNNING, SUCCEEDED, FAILED (with the reason) or LOST."""
        ...

    def stop_prepare(self, cluster: ClusterInfo, job_id: str, attempt: int) -> None:
        """Stop an early setup (the job it was for was cancelled or went elsewhere)."""
        ...
