"""The broker's domain model: job states and the records the engine and the store share."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from datetime import datetime


class JobState(enum.StrEnum):
    PENDING = "PENDING"
    PROVISIONING = "PROVISIONING"
    RUNNING = "RUNNING"
    CHECKPOINTING = "CHECKPOINTING"
    MIGRATING = "MIGRATING"
    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"
    CANCELLED = "CANCELLED"

    @property
    def terminal(self) -> bool:
        return self in TERMINAL_STATES


TERMINAL_STATES = frozenset({JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED})

# PENDING -> PROVISIONING -> RUNNING -> (CHECKPOINTING -> MIGRATING -> RUNNING)* -> terminal.
# PROVISIONING -> PENDING is a requeue when every offer of a plan failed; RUNNING -> PENDING is a
# requeue after an in-cluster preemption by a higher-priority gang.
ALLOWED_TRANSITIONS: dict[JobState, frozenset[JobState]] = {
    JobState.PENDING: frozenset({JobState.PROVISIONING, JobState.CANCELLED, JobState.FAILED}),
    JobState.PROVISIONING: frozenset(
        {JobState.RUNNING, JobState.PENDING, JobState.MIGRATING, JobState.FAILED, JobState.CANCELLED}
    ),
    JobState.RUNNING: frozenset(
        {JobState.CHECKPOINTING, JobState.MIGRATING, JobState.PENDING, JobState.SUCCEEDED,
         JobState.FAILED, JobState.CANCELLED}
    ),
    JobState.CHECKPOINTING: frozenset(
        {JobState.MIGRATING, JobState.PENDING, JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED}
    ),
    JobState.MIGRATING: frozenset({JobState.RUNNING, JobState.PENDING, JobState.FAILED, JobState.CANCELLED}),
    JobState.SUCCEEDED: frozenset(),
    JobState.FAILED: frozenset(),
    JobState.CANCELLED: frozenset(),
}


class IllegalTransition(RuntimeError):
    pass


def check_transition(current: JobState, target: JobState) -> None:
    if target not in ALLOWED_TRANSITIONS[current]:
        raise IllegalTransition(f"a job cannot move from {current} to {target}")


class ClusterState(enum.StrEnum):
    PROVISIONING = "PROVISIONING"
    UP = "UP"
    TERMINATING = "TERMINATING"
    TERMINATED = "TERMINATED"
    FAILED = "FAILED"  # never came up (capacity, quota, error): a failed launch

    @property
    def live(self) -> bool:
        return self in (ClusterState.PROVISIONING, ClusterState.UP, ClusterState.TERMINATING)


class Usage(enum.StrEnum):
    """What a ledger minute of GPUs was spent on; the idle causes feed the waste report."""

    RUNNING = "running"  # held by a job that was making progress
    PROVISIONING = "provisioning"
    RESTARTING = "restarting"  # checkpointing, restarting, and restoring from a checkpoint
    WAITING = "waiting"  # cluster up, nothing placed on these GPUs yet (queue empty)
    UNALLOCATED = "unallocated"  # free GPUs no queued gang fits (fragmentation)
    FINISHED = "finished"  # held by a job that has ended, until teardown


@dataclass(frozen=True, slots=True)
class GangPlacement:
    """The GPUs a gang holds on a cluster: for every node rank, the GPU indices it uses."""

    cluster_id: str
    gpus: tuple[tuple[int, tuple[int, ...]], ...]  # ((node_rank, (gpu, ...)), ...)

    @property
    def nodes(self) -> tuple[int, ...]:
        return tuple(rank for rank, _ in self.gpus)

    @property
    def gpu_count(self) -> int:
        return sum(len(g) for _, g in self.gpus)

    def visible_devices(self, node_rank: int) -> str:
        for rank, gpus in self.gpus:
            if rank == node_rank:
                return ",".join(str(g) for g in gpus)
        return ""

    @classmethod
    def whole_nodes(cls, cluster_id: str, num_nodes: int, gpus_per_node: int) -> GangPlacement:
        return cls(cluster_id, tuple((r, tuple(range(gpus_per_node))) for r in range(num_nodes)))

    def to_json(self) -> dict[str, list[int]]:
        return {str(rank): list(gpus) for rank, gpus in self.gpus}

    @classmethod
    def from_json(cls, cluster_id: str, data: dict[str, list[int]]) -> GangPlacement:
        return cls(cluster_id, tuple(sorted((int(k), tuple(v)) for k, v in data.items())))


@dataclass(frozen=True, slots=True)
class PreemptionNotice:
    """A cloud's warning that a node will be taken away at ``action_time``."""

    cluster_id: str
    node: str
    kind: str  # terminate | rebalance | maintenance
    action_time: datetime | None
    source: str  # agent | sqs | backend
    checkpoint: str | None = None
    signaled_at: float | None = None  # agent's wall clock when it signalled the job
    detail: dict[str, object] = field(default_factory=dict)

    @property
    def dedup_key(self) -> str:
        return f"{self.cluster_id}:{self.kind}"
