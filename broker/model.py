"""The broker's domain model: job states and the records the engine and the store share."""

from __future__ import annotations

import enum
import re

from broker.errors import BrokerError

# A team's name wherever one is given (tokens, job files, flags): no markup, escape or control
# character reaches a terminal, page or report from it.
TEAM_PATTERN = re.compile(r"^[A-Za-z0-9_.-]{1,100}$")


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
# The states the engine still drives, as stored.
ACTIVE_STATES = [s.value for s in JobState if not s.terminal]

# PENDING -> PROVISIONING -> RUNNING -> (CHECKPOINTING -> MIGRATING -> RUNNING)* -> terminal.
# PROVISIONING -> PENDING is a requeue when every offer of a plan failed; RUNNING -> PENDING is a
# requeue after an in-cluster preemption by a higher-priority gang; RUNNING -> PROVISIONING is a
# start that failed, tried again on the same GPUs.
ALLOWED_TRANSITIONS: dict[JobState, frozenset[JobState]] = {
    JobState.PENDING: frozenset({JobState.PROVISIONING, JobState.CANCELLED, JobState.FAILED}),
    JobState.PROVISIONING: frozenset(
        {JobState.RUNNING, JobState.PENDING, JobState.MIGRATING, JobState.FAILED, JobState.CANCELLED}
    ),
    JobState.RUNNING: frozenset(
        {JobState.CHECKPOINTING, JobState.MIGRATING, JobState.PENDING, JobState.PROVISIONING, JobState.SUCCEEDED,
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


class IllegalTransition(BrokerError, RuntimeError):
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


LIVE_CLUSTER_STATES = [s.value for s in ClusterState if s.live]


class CheckpointReason(enum.StrEnum):
    """Why a job is CHECKPOINTING: what asked it to save its work and leave."""

    NOTICE = "notice"  # the cloud is taking its nodes away
    MOVE = "move"  # the selection policy chose a better place and the new nodes are up
    PREEMPTED = "preempted"  # a higher-priority gang is taking its GPUs inside the cluster


class TeardownReason(enum.StrEnum):
    """Why a cluster is going away (or went away)."""

    IDLE = "idle"  # no active job holds it or is heading to it
    REPLACED = "replaced"  # its job is starting on another cluster and must leave this one first
    CLOUD = "cloud"  # the cloud or backend ended it (a preemption, a lost node)
    LAUNCH_FAILED = "launch_failed"  # it never came up


class Usage(enum.StrEnum):
    """What a ledger minute of GPUs was spent on; the idle causes feed the waste report."""

    RUNNING = "running"  # held by a job that was making progress
    PROVISIONING = "provisioning"
    RESTARTING = "restarting"  # checkpointing, restarting, and restoring from a checkpoint
    WAITING = "waiting"  # cluster up, nothing placed on these GPUs yet (queue empty)
    UNALLOCATED = "unallocated"  # free GPUs no queued gang fits (fragmentation)
    STRANDED = "stranded"  # what fractions leave of the GPUs they share (A100:0.5 alone: half a GPU)
    FINISHED = "finished"  # held by a job that has ended, until teardown
    QUEUE_DRAIN = "queue_drain"  # between one job's end and the next one's start, with a job waiting
    # Held by a running job whose GPUs were measured idle (broker/engine/gpu_attribution.py), by why:
    HELD_IDLE_STARTUP = "held_idle_startup"  # before the attempt's first progress report
    HELD_IDLE_CHECKPOINT = "held_idle_checkpoint"  # between a checkpoint request and its report
    HELD_IDLE_STALLED = "held_idle_stalled"  # anything else: input pipeline, CPU evaluation, a hung job
