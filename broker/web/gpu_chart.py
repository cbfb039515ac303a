"""The job page's GPU chart: each GPU's measured utilisation over the job's life, on the timeline's axis.

One line per GPU (node and index, per attempt), the minutes its agent measured; attempts, notices,
checkpoints and migrations marked as on the timeline. Hourly means beyond ``MAX_POINTS`` minutes per
GPU, so a month-long job's page stays small.
"""

from __future__ import annotations

from collections import defaultdict
from datetime import datetime
from html import escape as e
from typing import Any

from sqlalchemy import select

from broker.store.gpu import GpuMinuteRow
from broker.store.tables import CheckpointReportRow

MAX_POINTS = 720
PALETTE = ("#2f6fdb", "#e67e22", "#27ae60", "#8e44ad", "#c0392b", "#16a085", "#d35400", "#7f8c8d")


def load_gpu(s: Any, job_id: str) -> tuple[dict[tuple[int, str, int], list[tuple[datetime, float]]], list[datetime]]:
    """(attempt, node, GPU) -> [(minute, mean utilisation %)], and the job's checkpoint times."""
    series: dict[tuple[int, str, int], list[tuple[datetime, float]]] = defaultdict(list)
    M = GpuMinuteRow
    for attempt, node, gpu, at, util, job_util in s.execute(
            select(M.attempt, M.node, M.gpu, M.started_at, M.utilization_mean, M.job_utilization_mean)
            .where(M.job_id == job_id).order_by(M.started_at)):
        value = job_util if job_util is not None else util
        if value is not None:
            series[(attempt, node, gpu)].append((at, float(value)))
    for key, points in series.items():
        if len(points) > MAX_POINTS:
            hours: dict[datetime, list[float]] = defaultdict(list)
            for at, value in points:
                hours[at.replace(minute=0, second=0, microsecond=0)].append(value)
            series[key] = [(hour, sum(v) / len(v)) for hour, v in sorted(hours.items())]
    checkpoints = list(s.scalars(select(CheckpointReportRow.written_at).where(CheckpointReportRow.job_id == job_id)
                                 .order_by(CheckpointReportRow.written_at)))
    return dict(series), checkpoints


def gpu_svg(series: dict[tuple[int, str, int], list[tuple[datetime, float]]], checkpoints: list[datetime],
            marks: list[tuple[str, datetime, str]], start: datetime, end: datetime) -> str:
    """The chart; ``marks`` are (class, time, label) of attempts, notices and migrations."""
    if not series:
        return '<p class="gpu-unmeasured">Not measured: no agent reported this job\'s GPUs (no NVML on its nodes).</p>'
    span = max((end - start).total_seconds(), 1.0)
    width, top, height = 760.0, 16, 120

    def x(at: datetime) -> float:
        return 120 + width * max(min((at - start).total_seconds() / span, 1.0), 0.0)

    def y(value: float) -> float:
        return top + height - height * max(min(value, 100.0), 0.0) / 100.0

    parts = [f'<text x="4" y="{top + 10}" class="lane">GPU util %</text>',
             f'<text x="{width + 124:.0f}" y="{top + 8}" class="lane">100%</text>',
             f'<line x1="120" x2="{width + 120:.0f}" y1="{y(0):.1f}" y2="{y(0):.1f}" stroke="#ccc"/>']
    for i, ((attempt, node, gpu), points) in enumerate(sorted(series.items())):
        colour = PALETTE[i % len(PALETTE)]
        line = " ".join(f"{x(at):.1f},{y(v):.1f}" for at, v in points)
        mean = sum(v for _, v in points) / len(points)
        parts.append(f'<polyline class="gpu-util" data-attempt="{attempt}" data-node="{e(node)}" data-gpu="{gpu}" '
                     f'points="{line}" fill="none" stroke="{colour}" stroke-width="1.5"><title>attempt {attempt}, '
                     f'node {e(node)}, GPU {gpu}: mean {mean:.0f}%</title></polyline>')
    for at in checkpoints:
        parts.append(f'<g class="marker checkpoint"><line x1="{x(at):.1f}" x2="{x(at):.1f}" y1="{top}" '
                     f'y2="{y(0):.1f}" stroke="#27ae60" stroke-dasharray="2 2"/><title>checkpoint '
                     f'{at:%H:%M:%S}</title></g>')
    colours = {"attempt": "#555", "notice": "#c0392b", "migration": "#8e44ad"}
    for kind, at, label in marks:
        parts.append(f'<g class="marker {e(kind)}"><line x1="{x(at):.1f}" x2="{x(at):.1f}" y1="{top - 6}" '
                     f'y2="{y(0):.1f}" stroke="{colours.get(kind, "#555")}" stroke-width="1.5"/>'
                     f'<title>{e(label)}</title></g>')
    bottom = y(0) + 16
    return (f'<svg class="gpu-chart" viewBox="0 0 {width + 200:.0f} {bottom:.0f}" width="100%" role="img" '
            f'aria-label="GPU utilisation">{"".join(parts)}</svg>')
