"""Eager allocation: whether to ready a queued job now, before a running job's predicted finish.

A queued job can be readied in one of two ways, and the engine asks this policy about each:

- **reserve**: the queued job fits the GPUs a running job holds. Reserving costs nothing (those GPUs
  are paid for either way) and never shortens the running job: the queued job starts only once the
  running job has left, however long it runs. It is worth doing once the predicted finish is near
  (within ``lead_s``), so the GPUs go to the next job the moment they free up, not to whatever asks
  first.
- **boot**: the queued job needs a new cluster, and the pool is full (``max_gpus``) until the
  running job's cluster goes. Booting now brings the new cluster up in ``boot_s``; waiting for the
  end makes the queued job wait ``boot_s`` after it (the idle removed). If the running job outlives
  the boot, both clusters are paid at once, beyond the pool's size: at worst (the high end of the
  prediction) for ``high_s - boot_s``. Boot when that worst-case overlap costs no more than the wait
  it removes, and the predicted finish is within ``boot_s + lead_s``.

- **release**: a queued job holds a reservation and the running job's finish has slipped: it ran
  past the high end of the prediction the reservation was made on (``overrun_s``), or its current
  prediction now says later than that (``slip_s``). The running job keeps its GPUs either way; the
  question is whether the queued job waits for them. Its holder is expected to need the current
  prediction's ``remaining_s`` while that prediction's interval still holds (``high_s`` > 0), and
  once that has failed too, as long again as it has overrun (a job already late by X is taken to be
  late by about X more). Give the reservation up when the job could run elsewhere sooner
  (``elsewhere_s``: a new cluster's boot, within the pool's size), so it is placed as it would be
  without eager allocation; keep it when it is on time or there is nowhere else (``None``).

``eager`` decides so; ``off`` (the default) never readies anything early.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal, Protocol

from policies.registry import Registry

Kind = Literal["reserve", "boot", "release"]


@dataclass(frozen=True, slots=True)
class EagerRequest:
    kind: Kind
    remaining_s: float  # predicted market seconds until the running job finishes (median)
    low_s: float
    high_s: float
    lead_s: float  # how near a predicted finish must be before anything is readied
    boot_s: float = 0.0  # market seconds a new cluster takes to come up (boot only)
    price_per_hour: float = 0.0  # of the cluster that would boot (boot only)
    overrun_s: float = 0.0  # release: market seconds past the high end of the prediction reserved on
    slip_s: float = 0.0  # release: how far the current predicted finish is past that high end
    elsewhere_s: float | None = None  # release: market seconds until it could run elsewhere; None: nowhere

    def __post_init__(self) -> None:
        for name in ("remaining_s", "low_s", "high_s", "lead_s", "boot_s", "price_per_hour", "overrun_s",
                     "slip_s", "elsewhere_s"):
            value = getattr(self, name)
            if value is None and name == "elsewhere_s":
                continue
            if not (math.isfinite(value) and value >= 0):
                raise ValueError(f"{name} must be a finite number >= 0, got {value!r}")


@dataclass(frozen=True, slots=True)
class EagerDecision:
    act: bool
    reason: str
    early_cost: float = 0.0  # USD paid at worst for booting early (boot only)
    idle_removed_s: float = 0.0  # market seconds of the queued job's wait removed


class EagerPolicy(Protocol):
    """Whether to ready a queued job now, before a running job's predicted finish."""

    def __call__(self, request: EagerRequest, /) -> EagerDecision: ...


EAGER_POLICIES: Registry[EagerPolicy] = Registry("eager")


@EAGER_POLICIES.register("eager")
def eager(request: EagerRequest) -> EagerDecision:
    if request.kind == "release":
        return _release(request)
    if request.kind == "reserve":
        if request.remaining_s > request.lead_s:
            return EagerDecision(False, f"predicted finish in {request.remaining_s:.0f} s, beyond the "
                                        f"{request.lead_s:.0f} s lead")
        return EagerDecision(True, f"predicted finish in {request.remaining_s:.0f} s "
                                   f"({request.low_s:.0f}-{request.high_s:.0f} s): reserve its GPUs")
    removed = min(request.boot_s, request.remaining_s)
    if request.remaining_s > request.boot_s + request.lead_s:
        return EagerDecision(False, f"predicted finish in {request.remaining_s:.0f} s; a boot takes "
                                    f"{request.boot_s:.0f} s: too early to boot")
    overlap_s = max(request.high_s - request.boot_s, 0.0)
    cost = request.price_per_hour * overlap_s / 3600.0
    removed_value = request.price_per_hour * removed / 3600.0
    if cost > removed_value:
        return EagerDecision(False, f"booting now could pay ${cost:.4f} for {overlap_s:.0f} s of overlap if the "
                                    f"job runs to its high estimate, more than the {removed:.0f} s of wait "
                                    f"it removes (${removed_value:.4f})", cost, removed)
    return EagerDecision(True, f"boot now: up in {request.boot_s:.0f} s, predicted finish in "
                               f"{request.remaining_s:.0f} s ({request.low_s:.0f}-{request.high_s:.0f} s); at worst "
                               f"${cost:.4f} of overlap against {removed:.0f} s of wait removed "
                               f"(${removed_value:.4f})", cost, removed)


def _release(request: EagerRequest) -> EagerDecision:
    if request.overrun_s <= 0 and request.slip_s <= 0:
        return EagerDecision(False, "the running job is on time: keep the reservation")
    if request.high_s > 0:
        expected, why = request.remaining_s, f"now predicted to finish in {request.remaining_s:.0f} s"
    else:
        expected, why = request.overrun_s, f"{request.overrun_s:.0f} s past its predicted finish, no estimate holds"
    if request.elsewhere_s is None:
        return EagerDecision(False, f"{why}; nowhere else to run: keep the reservation")
    if request.elsewhere_s >= expected:
        return EagerDecision(False, f"{why}; elsewhere in {request.elsewhere_s:.0f} s is no sooner: "
                                    "keep the reservation")
    return EagerDecision(True, f"{why}; it could run elsewhere in {request.elsewhere_s:.0f} s: give the "
                               "reservation up", idle_removed_s=expected - request.elsewhere_s)


@EAGER_POLICIES.register("off", default=True)
def off(request: EagerRequest) -> EagerDecision:
    return EagerDecision(False, "eager allocation is off")
