"""Tiny hand-made market traces for tests: written as real trace CSV and parsed by the real reader."""

from __future__ import annotations

import io
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta

from providers.trace import COLUMNS, MarketTrace, format_time, parse_trace

START = datetime(2024, 1, 1, tzinfo=UTC)


def trace_text(available: Sequence[Sequence[int]], spot: Sequence[Sequence[float]] | None = None,
               on_demand: Sequence[Sequence[float]] | None = None,
               zones: Sequence[tuple[str, str]] = (("us-east-1a", "us-east-1"),),
               tick_s: int = 60, skip: Sequence[int] = ()) -> str:
    """Rows ``[tick][zone]``; ``zones`` are (zone, region); ticks listed in ``skip`` are left out."""
    lines = [",".join(COLUMNS)]
    for t, row in enumerate(available):
        if t in skip:
            continue
        when = format_time(START + timedelta(seconds=t * tick_s))
        for z, (zone, region) in enumerate(zones):
            price = spot[t][z] if spot is not None else 1.0
            od = on_demand[t][z] if on_demand is not None else 3.0
            lines.append(f"{when},aws,{region},{zone},p3.2xlarge,V100,1,{price},{od},{row[z]}")
    return "\n".join(lines) + "\n"


def make_trace(available: Sequence[Sequence[int]], **kwargs: object) -> MarketTrace:
    return parse_trace(io.StringIO(trace_text(available, **kwargs)))  # type: ignore[arg-type]
