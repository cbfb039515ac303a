"""How often a running job should checkpoint: the interval that minimises lost work plus overhead.

Every policy is ``policy(request: CheckpointRequest) -> CheckpointPlan``, pure.

A preemption costs the work done since the last complete checkpoint, unless the job can write a
checkpoint inside the cloud's notice (AWS gives 120 s, GCP and Azure 30 s): a 50 GB checkpoint at
500 MB/s takes 100 s and fits in none but AWS's. So the hazard that matters is the rate of
preemptions whose notice is too short for the job's checkpoint, plus the rate of those that come
with no usable notice at all (a notice missed or never sent).

``young_daly`` (the default): with that effective hazard ``lam`` and the measured checkpoint time
``d``, the mean time to a loss is ``M = 1 / lam`` and Daly's higher-order optimum of Young's rule
gives the compute time between checkpoints

    tau = sqrt(2 d M) * (1 + sqrt(d / (2 M)) / 3 + d / (18 M)) - d      if d < 2 M
    tau = M                                                            otherwise

(J. T. Daly, "A higher order estimate of the optimum checkpoint interval for restart dumps",
FGCS 22(3), 2006; J. W. Young, CACM 17(9), 1974). No periodic checkpoints are asked for when the
effective hazard is zero: the notice checkpoint keeps all the work.

``notice_only`` and ``fixed_interval`` are the baselines it is measured against.

The hazard itself is ``blended_hazard``: the broker's own count of preemptions over the spot time
it ran in the zone, with a prior worth one preemption. Without a word from the cloud the prior is
one preemption per day of running; where the cloud states an expected uptime before preemption
(GCP's ``advice.capacity`` ``estimatedUptime``, or its daily preemption rate from
``advice.capacityHistory``), the prior is one preemption per that uptime. So a zone the broker has
never run in starts from what the cloud says, and its own record takes over as it grows: after
one uptime's worth of running the two weigh the same.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Protocol

from policies.registry import Registry

# The agent gives up waiting for a checkpoint this long before the node goes (broker/agent).
NOTICE_MARGIN_S = 1.0
# What "no usable notice" costs when nothing is known: a share of preemptions arrive unannounced.
DEFAULT_UNANNOUNCED_FRACTION = 0.05
FIXED_INTERVAL_S = 15 * 60.0
# Without a word from the cloud, the prior hazard is one preemption per day of spot running.
DEFAULT_PRIOR_UPTIME_S = 24 * 3600.0
MIN_INTERVAL_S = 60.0
MAX_INTERVAL_S = 24 * 3600.0


@dataclass(frozen=True, slots=True)
class CheckpointRequest:
    hazard_per_s: float  # preemptions per second of running in this zone (learned)
    checkpoint_s: float  # measured time to write one checkpoint
    notice_s: float  # the cloud's notice lead time (0 when it gives none)
    unannounced_fraction: float = DEFAULT_UNANNOUNCED_FRACTION

    def __post_init__(self) -> None:
        for name in ("hazard_per_s", "checkpoint_s", "notice_s"):
            value = getattr(self, name)
            if not math.isfinite(value) or value < 0:
                raise ValueError(f"{name} must be a finite number >= 0, got {value!r}")
        if not 0.0 <= self.unannounced_fraction <= 1.0:
            raise ValueError(f"unannounced_fraction must be in [0, 1], got {self.unannounced_fraction!r}")

    @property
    def notice_fits(self) -> bool:
        return self.checkpoint_s + NOTICE_MARGIN_S <= self.notice_s

    @property
    def loss_hazard_per_s(self) -> float:
        """The rate of preemptions that cost the work since the last periodic checkpoint."""
        share = self.unannounced_fraction if self.notice_fits else 1.0
        return self.hazard_per_s * share


@dataclass(frozen=True, slots=True)
class CheckpointPlan:
    interval_s: float | None  # compute seconds between periodic checkpoints; None: only on a notice
    reason: str


def expected_waste_fraction(request: CheckpointRequest, interval_s: float | None) -> float:
    """First-order share of running time lost to checkpoint overhead and redone work.

    Periodic checkpoints cost ``d / (tau + d)``; a loss costs on average half a cycle; a notice that
    fits costs one checkpoint per preemption.
    """
    lam, d = request.loss_hazard_per_s, request.checkpoint_s
    notice_cost = request.hazard_per_s * d if request.notice_fits else 0.0
    if interval_s is None:
        # Nothing periodic: every loss takes all the work since the run began, so a job longer than
        # a run never keeps any progress.
        return 1.0 if lam > 0 else min(1.0, notice_cost)
    cycle = interval_s + d
    return min(1.0, d / cycle + lam * cycle / 2 + notice_cost)


def daly_interval(checkpoint_s: float, mean_time_to_loss_s: float) -> float:
    d, m = checkpoint_s, mean_time_to_loss_s
    if d >= 2 * m:
        return m
    return math.sqrt(2 * d * m) * (1 + math.sqrt(d / (2 * m)) / 3 + d / (18 * m)) - d


def blended_hazard(preemptions: int, exposure_s: float, prior_uptime_s: float | None = None) -> float:
    """Preemptions per second of spot running: the broker's own ``preemptions`` over ``exposure_s``
    seconds, with a prior of one preemption per ``prior_uptime_s`` (the cloud's expected uptime;
    a day when it says nothing). The posterior mean of a gamma prior of shape 1 and that mean."""
    if preemptions < 0 or not math.isfinite(exposure_s) or exposure_s < 0:
        raise ValueError(f"expected preemptions >= 0 and a finite exposure >= 0, got {preemptions}, {exposure_s}")
    uptime = DEFAULT_PRIOR_UPTIME_S if prior_uptime_s is None else prior_uptime_s
    if not math.isfinite(uptime) or uptime <= 0:
        uptime = DEFAULT_PRIOR_UPTIME_S
    return (preemptions + 1) / (exposure_s + uptime)


class CheckpointingPolicy(Protocol):
    """How often a running job should checkpoint."""

    def __call__(self, request: CheckpointRequest, /) -> CheckpointPlan: ...


CHECKPOINTING_POLICIES: Registry[CheckpointingPolicy] = Registry("checkpointing")


@CHECKPOINTING_POLICIES.register("young_daly", default=True)
def young_daly(request: CheckpointRequest) -> CheckpointPlan:
    lam = request.loss_hazard_per_s
    if lam <= 0:
        return CheckpointPlan(None, "no preemption without a usable notice is expected")
    if request.checkpoint_s <= 0:
        return CheckpointPlan(MIN_INTERVAL_S, "checkpoints cost nothing measurable")
    interval = min(MAX_INTERVAL_S, max(MIN_INTERVAL_S, daly_interval(request.checkpoint_s, 1 / lam)))
    why = ("the notice fits the checkpoint; periodic ones cover unannounced preemptions" if request.notice_fits
           else f"a {request.checkpoint_s:.0f} s checkpoint does not fit a {request.notice_s:.0f} s notice")
    return CheckpointPlan(interval, f"{why}: one every {interval / 60:.1f} min of work")


@CHECKPOINTING_POLICIES.register("notice_only")
def notice_only(request: CheckpointRequest) -> CheckpointPlan:
    return CheckpointPlan(None, "checkpoint only on a notice")


@CHECKPOINTING_POLICIES.register("fixed_interval")
def fixed_interval(request: CheckpointRequest) -> CheckpointPlan:
    return CheckpointPlan(FIXED_INTERVAL_S, "every 15 minutes")
