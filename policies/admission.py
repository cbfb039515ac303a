"""Admission: may a queued job of a queue start now, given the capacity share its queue holds?

A time-based policy (``policy_schedules`` in the settings) gives each queue a share of the
broker's GPU capacity; a job is admitted while its queue stays within its share.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Protocol

from policies.registry import Registry


@dataclass(frozen=True, slots=True)
class AdmissionRequest:
    queue: str
    gpus: int  # what the job would take (nodes x GPUs per node)
    held_by_queue: int  # GPUs the queue's started jobs hold now
    capacity_gpus: int | None  # None: no capacity limit configured
    share: float | None  # None: no share set for this queue


class AdmissionPolicy(Protocol):
    """Whether a queued job may be planned now."""

    def __call__(self, request: AdmissionRequest, /) -> bool: ...


ADMISSION_POLICIES: Registry[AdmissionPolicy] = Registry("admission")


@ADMISSION_POLICIES.register("capacity_share", default=True)
def capacity_share(request: AdmissionRequest) -> bool:
    if request.capacity_gpus is None or request.share is None:
        return True
    allowed = math.floor(request.share * request.capacity_gpus + 1e-9)
    return request.held_by_queue + request.gpus <= allowed


@ADMISSION_POLICIES.register("admit_all")
def admit_all(request: AdmissionRequest) -> bool:
    return True
