"""Which GPU type a job with alternatives (``any_of``) should run on: the cheapest unit of work.

A job's work is stated as time on its *first* alternative. On an accelerator that trains ``s``
times as fast as the first one, an hour of work takes ``1 / s`` hours, so the price that matters is
``price per hour / s``: the cost of a unit of work. SkyPilot and dstack compare hourly prices.

Where the speeds come from, best first:

1. the job's own ``broker.speed`` (``{H100: 2.1, A100-80GB: 1.0}``, relative to each other);
2. the speed the job was seen to make on each type from its progress reports (the agent reports no
   progress yet: ``learned`` is the seam, always empty today);
3. ``DEFAULT_SPEED``: relative training throughput per GPU model. These are rough, workload-
   dependent figures (mixed-precision training of CNNs and transformers), V100 = 1.0, from:
   - Lambda, "Deep Learning GPU Benchmarks" (PyTorch training throughput, 2022 and 2023 runs,
     lambdalabs.com/gpu-benchmarks): A100 about 2.2x and A100-80GB about 2.4x a V100; T4 about a
     third of a V100; A10/A10G a little over half;
   - NVIDIA, "NVIDIA A100 Tensor Core GPU Architecture" whitepaper (2020): A100 up to 2.5x V100 on
     BERT-large training (TF32/FP16);
   - Lambda, "DeepChat 3-step training at scale: H100 SXM5 vs A100 SXM4" (2023): H100 2.5-3.1x an
     A100 on OPT-13B/350M FP16 training; NVIDIA's H100 whitepaper (2022) claims up to 3x at FP16,
     more with FP8; Lambda's 2023 PyTorch benchmarks measure nearer 1.8-2.3x, so 2x an A100-80GB;
   - L4 and V100-32GB: NVIDIA datasheets (L4 about a T4's tensor throughput x 2.5; V100-32GB the
     same chip as V100).
   A job whose speed differs should state ``broker.speed``.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

DEFAULT_SPEED: Mapping[str, float] = {
    "T4": 0.35,
    "A10": 0.55,
    "A10G": 0.55,
    "L4": 0.6,
    "V100": 1.0,
    "V100-32GB": 1.0,
    "A100": 2.2,
    "A100-80GB": 2.4,
    "H100": 4.8,
}
UNKNOWN_SPEED = 1.0  # an accelerator in no table: as fast as a V100
MAX_SPEED = 1000.0  # a stated speed above this is a typo (the spread between real GPUs is ~15x)


def speed_of(accelerator: str, stated: Mapping[str, float] | None = None,
             learned: Mapping[str, float] | None = None) -> float:
    """Relative speed of ``accelerator``: stated, else learned from progress (seam), else the table."""
    for table in (stated or {}, learned or {}):
        for name, value in table.items():
            if name.lower() == accelerator.lower() and math.isfinite(value) and value > 0:
                return float(value)
    for name, value in DEFAULT_SPEED.items():
        if name.lower() == accelerator.lower():
            return value
    return UNKNOWN_SPEED


def relative_speed(accelerator: str, first: str, stated: Mapping[str, float] | None = None,
                   learned: Mapping[str, float] | None = None) -> float:
    """How many hours of the job's stated work (time on ``first``) an hour on ``accelerator`` does.

    Stated speeds only compare among themselves: when the job states some of its alternatives and
    not others, the table fills in the rest in the table's own units, so mixing is avoided by
    using the table for both ends unless both are stated."""
    stated = stated or {}
    both = {a.lower() for a in stated} >= {accelerator.lower(), first.lower()}
    table = stated if both else None
    return speed_of(accelerator, table, learned) / speed_of(first, table, learned)


@dataclass(frozen=True, slots=True)
class Choice:
    accelerator: str
    speed: float  # relative to the job's first alternative
    hourly: float  # the price compared: USD per node-hour
    per_work: float  # hourly / speed: USD per node-hour of the job's stated work


def rank_accelerators(prices: Iterable[tuple[str, float]], first: str, stated: Mapping[str, float] | None = None,
                      learned: Mapping[str, float] | None = None) -> list[Choice]:
    """Each accelerator's lowest price (per node-hour) divided by its speed, cheapest unit of work first.

    ``prices`` holds (accelerator, price per node-hour) pairs, e.g. one per zone with capacity."""
    lowest: dict[str, float] = {}
    for accelerator, price in prices:
        if math.isfinite(price) and price >= 0:
            lowest[accelerator] = min(price, lowest.get(accelerator, math.inf))
    choices = []
    for accelerator, price in lowest.items():
        speed = relative_speed(accelerator, first, stated, learned)
        choices.append(Choice(accelerator, speed, price, price / speed))
    return sorted(choices, key=lambda c: (c.per_work, c.accelerator))
