"""FGD's inflation experiment on an Alibaba GPU-sharing trace (cluster-trace-gpu-v2023 columns).

Inputs are the published node list (``sn,cpu_milli,memory_mib,gpu,model``) and pod list
(``name,cpu_milli,memory_mib,num_gpu,gpu_milli`` and, optionally, ``gpu_spec``; other columns are
ignored). Every published layout reads: the ``multigpu*`` lists have only the five required
columns, and a missing ``gpu_spec`` means what an empty one means in the paper's simulator: any GPU
model.

The workload is inflated as the paper's simulator does: every pod of the list, plus pods drawn
from it at random with replacement until the GPU they request would pass ``until`` times the
cluster's GPU capacity (or pods removed at random while it is above), then shuffled; all of it
seeded. Tasks arrive one by one and never leave; each is placed by the policy or refused. After
each 10 % of the cluster's GPU capacity has arrived (requested, placed or not), the share of GPU
capacity not allocated is recorded: the paper's Figure 9(a) curve.

The fragmentation-aware policy weighs the task shapes seen so far, including the arriving one, by
the GPU share they brought; the others ignore the mix.
"""

from __future__ import annotations

import csv
import io
import math
import statistics
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from broker.errors import UserError
from policies.sharing import (
    MILLI,
    SharingCluster,
    SharingNode,
    SharingPlacement,
    SharingRequest,
    TaskShape,
    WorkloadMix,
)
from providers.bounded import capped_bytes

NODE_COLUMNS = ("sn", "cpu_milli", "memory_mib", "gpu", "model")
POD_COLUMNS = ("name", "cpu_milli", "memory_mib", "num_gpu", "gpu_milli")
POD_OPTIONAL_COLUMNS = ("gpu_spec",)  # absent: every pod takes any GPU model
MAX_FILE_BYTES = 64 * 1024 * 1024
MAX_ROWS = 1_000_000
MAX_POD_ROWS = 200_000  # the published lists have about 9,000; a replay never has more tasks than this
MAX_NODES = 100_000
# Bounds that keep every figure meaningful: a node of up to 4,096 cores, 64 TiB and 64 GPUs.
MAX_CPU_MILLI = 4_096_000
MAX_MEMORY_MIB = 64 * 1024 * 1024
MAX_GPUS = 64
MAX_INFLATED_TASKS = 200_000

Policy = Callable[[SharingRequest, SharingCluster], SharingPlacement | None]


class ClusterTraceError(UserError, ValueError):
    """A trace file that cannot be used; the message names the file, the row and the column."""


@dataclass(frozen=True, slots=True)
class Pod:
    name: str
    shape: TaskShape


def _rows(path: Path, columns: tuple[str, ...], what: str, max_rows: int | None = None,
          optional: tuple[str, ...] = ()) -> Iterator[tuple[int, dict[str, str]]]:
    limit = MAX_ROWS if max_rows is None else max_rows
    try:
        size = path.stat().st_size
        if size > MAX_FILE_BYTES:
            raise ClusterTraceError(f"{path}: {size} bytes is more than the {MAX_FILE_BYTES} a {what} may have")
        raw = capped_bytes(path, MAX_FILE_BYTES, ClusterTraceError)  # /dev/zero has size 0 and no end
    except OSError as exc:
        raise ClusterTraceError(f"cannot read {what} {path}: {exc.strerror or exc}") from None
    if b"\x00" in raw:
        row = raw[: raw.index(b"\x00")].count(b"\n") + 1
        raise ClusterTraceError(f"{path}: row {row}: contains a NUL byte")
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        row = raw[: exc.start].count(b"\n") + 1
        raise ClusterTraceError(f"{path}: row {row}: not UTF-8 text") from None
    reader = csv.DictReader(io.StringIO(text, newline=""))
    try:
        header = reader.fieldnames or ()
    except csv.Error as exc:
        raise ClusterTraceError(f"{path}: row 1: not a CSV header ({exc})") from None
    missing = [c for c in columns if c not in header]
    if missing:
        raise ClusterTraceError(f"{path}: row 1: missing column(s) {', '.join(missing)}; a {what} has "
                         f"{','.join(columns)}" + (f" (and optionally {','.join(optional)})" if optional else ""))
    present = (*columns, *(c for c in optional if c in header))
    row = 1
    try:
        for row, rec in enumerate(reader, start=2):
            if row > limit + 1:
                raise ClusterTraceError(f"{path}: row {row}: more than {limit} rows")
            if None in rec or any(rec.get(c) is None for c in present):
                raise ClusterTraceError(f"{path}: row {row}: expected {len(header)} columns")
            yield row, rec
    except csv.Error as exc:
        raise ClusterTraceError(f"{path}: row {row + 1}: not valid CSV ({exc})") from None


def _int(path: Path, row: int, column: str, text: str, low: int, high: int) -> int:
    text = text.strip()
    try:
        value = int(text)
    except ValueError:
        try:
            number = float(text)
        except ValueError:
            raise ClusterTraceError(
                f"{path}: row {row}: {column}: expected a whole number, got {text[:40]!r}") from None
        if not math.isfinite(number) or number != int(number):
            raise ClusterTraceError(
                f"{path}: row {row}: {column}: expected a whole number, got {text[:40]!r}") from None
        value = int(number)
    if not low <= value <= high:
        raise ClusterTraceError(f"{path}: row {row}: {column}: {value} is out of range {low}..{high}")
    return value


def _name(path: Path, row: int, column: str, text: str) -> str:
    name = text.strip()
    if not name:
        raise ClusterTraceError(f"{path}: row {row}: {column}: empty")
    if not name.isprintable():
        raise ClusterTraceError(f"{path}: row {row}: {column}: contains control characters")
    return name


def read_nodes(path: Path) -> list[SharingNode]:
    """The node list; ClusterTraceError naming the first bad cell."""
    nodes: list[SharingNode] = []
    seen: set[str] = set()
    for row, rec in _rows(path, NODE_COLUMNS, "node list", MAX_NODES):
        name = _name(path, row, "sn", rec["sn"])
        if name in seen:
            raise ClusterTraceError(f"{path}: row {row}: sn: {name!r} appears twice")
        seen.add(name)
        cpu = _int(path, row, "cpu_milli", rec["cpu_milli"], 1, MAX_CPU_MILLI)
        mem = _int(path, row, "memory_mib", rec["memory_mib"], 1, MAX_MEMORY_MIB)
        gpus = _int(path, row, "gpu", rec["gpu"], 0, MAX_GPUS)
        model = rec["model"].strip()
        if gpus and not model:
            raise ClusterTraceError(f"{path}: row {row}: model: empty for a node with GPUs")
        if model and not model.isprintable():
            raise ClusterTraceError(f"{path}: row {row}: model: contains control characters")
        nodes.append(SharingNode(name, cpu, mem, gpus, model))
    if not nodes:
        raise ClusterTraceError(f"{path}: no nodes")
    return nodes


def read_pods(path: Path, nodes: list[SharingNode]) -> list[Pod]:
    """The pod list; ClusterTraceError naming the first bad cell, or a GPU type no node has."""
    models = {n.gpu_model for n in nodes if n.gpus}
    pods: list[Pod] = []
    limit = min(MAX_ROWS, MAX_POD_ROWS)
    for row, rec in _rows(path, POD_COLUMNS, "pod list", limit, POD_OPTIONAL_COLUMNS):
        name = _name(path, row, "name", rec["name"])
        cpu = _int(path, row, "cpu_milli", rec["cpu_milli"], 0, MAX_CPU_MILLI)
        mem = _int(path, row, "memory_mib", rec["memory_mib"], 0, MAX_MEMORY_MIB)
        gpus = _int(path, row, "num_gpu", rec["num_gpu"], 0, MAX_GPUS)
        milli = _int(path, row, "gpu_milli", rec["gpu_milli"], 0, MILLI)
        if gpus == 0 and milli:
            raise ClusterTraceError(f"{path}: row {row}: gpu_milli: {milli} for a pod with num_gpu 0")
        if gpus and not milli:
            raise ClusterTraceError(f"{path}: row {row}: gpu_milli: 0 for a pod with num_gpu {gpus}")
        if gpus > 1 and milli != MILLI:
            raise ClusterTraceError(f"{path}: row {row}: gpu_milli: a share of {milli} is for one GPU only, "
                             f"not {gpus}")
        spec = (rec.get("gpu_spec") or "").strip()
        # "V100M16|V100M32|V100M32" as published: a set of models, so equal sets make one task shape.
        types = tuple(sorted({t.strip() for t in spec.split("|") if t.strip()})) if spec else ()
        for t in types:
            if t not in models:
                raise ClusterTraceError(f"{path}: row {row}: gpu_spec: no node has GPU type {t[:40]!r}; "
                                 f"the nodes have {', '.join(sorted(models)) or 'no GPUs'}")
        pods.append(Pod(name, TaskShape(cpu, mem, gpus, milli, 0, types if gpus else ())))
    if not pods:
        raise ClusterTraceError(f"{path}: no pods")
    return pods


def inflate(pods: list[Pod], capacity_milli: int, until: float, seed: int) -> list[Pod]:
    """The pods, topped up (or thinned) at random to ``until`` x capacity of GPU request, shuffled."""
    import numpy as np

    rng = np.random.default_rng(seed)
    target = until * capacity_milli
    tasks = list(pods)
    total = sum(p.shape.total_gpu_milli for p in tasks)
    if total <= 0:
        raise ClusterTraceError("the pod list requests no GPU, so there is no GPU workload to inflate")
    mean = total / len(tasks)
    if target / mean > MAX_INFLATED_TASKS:
        raise ClusterTraceError(f"reaching {until:g} x the cluster's GPU capacity takes about {target / mean:.0f} "
                                f"tasks from this pod list, more than the {MAX_INFLATED_TASKS} a replay may have; "
                                f"lower --until or use a smaller node list")
    if total > target:
        # Removing pods one at a time at random is removing them in a random order: one pass, not a
        # list.pop per pod, so a long list is thinned in linear time.
        drop: set[int] = set()
        for i in rng.permutation(len(tasks)):
            if total <= target:
                break
            drop.add(int(i))
            total -= tasks[int(i)].shape.total_gpu_milli
        tasks = [t for i, t in enumerate(tasks) if i not in drop]
    else:
        n = 0
        while True:
            pod = pods[int(rng.integers(len(pods)))]
            if total + pod.shape.total_gpu_milli > target or len(tasks) >= MAX_INFLATED_TASKS:
                break
            total += pod.shape.total_gpu_milli
            tasks.append(Pod(f"{pod.name}-tuned-{n}", pod.shape))
            n += 1
    order = rng.permutation(len(tasks))
    return [tasks[int(i)] for i in order]


@dataclass(frozen=True, slots=True)
class CurvePoint:
    arrived_pct: int
    unallocated_gpu_pct: float


@dataclass(frozen=True, slots=True)
class SharingResult:
    policy: str
    tasks: int
    curve: tuple[CurvePoint, ...]
    unallocated_gpu_pct: float
    allocated_gpu_pct: float
    failed_tasks: int
    decision_ms_p50: float

    def to_json(self) -> dict[str, object]:
        return {
            "curve": [{"arrived_pct": p.arrived_pct, "unallocated_gpu_pct": round(p.unallocated_gpu_pct, 4)}
                      for p in self.curve],
            "unallocated_gpu_pct": round(self.unallocated_gpu_pct, 4),
            "allocated_gpu_pct": round(self.allocated_gpu_pct, 4),
            "failed_tasks": self.failed_tasks,
            "decision_ms_p50": round(self.decision_ms_p50, 4),
        }

    def at(self, arrived_pct: int) -> float | None:
        return next((p.unallocated_gpu_pct for p in self.curve if p.arrived_pct == arrived_pct), None)


def replay(tasks: list[Pod], nodes: list[SharingNode], name: str, policy: Policy, seed: int = 0,
           until: float = 1.3) -> SharingResult:
    """Place ``tasks`` in order on an empty cluster of ``nodes``; none leaves."""
    cluster = SharingCluster.of(nodes)
    capacity = cluster.gpu_capacity_milli
    counts: dict[TaskShape, float] = {}
    mix = WorkloadMix()
    arrived = 0
    allocated = 0
    failed = 0
    timings: list[float] = []
    curve: list[CurvePoint] = []
    next_mark = 10
    last_mark = round(until * 100)
    for i, pod in enumerate(tasks):
        shape = pod.shape
        if shape not in counts:
            counts[shape] = 0
            cluster = cluster.with_shapes((shape,))
        counts[shape] += 1
        mix = WorkloadMix.by_gpu_demand(counts)
        request = SharingRequest(shape, mix, seed * 1_000_003 + i, pod.name)
        start = time.perf_counter()
        placement = policy(request, cluster)
        timings.append(time.perf_counter() - start)
        if placement is None:
            failed += 1
        else:
            cluster = cluster.with_placement(shape, placement)
            allocated += shape.total_gpu_milli
        arrived += shape.total_gpu_milli
        while next_mark <= last_mark and arrived >= next_mark / 100 * capacity:
            curve.append(CurvePoint(next_mark, 100 * (capacity - allocated) / capacity))
            next_mark += 10
    if next_mark == last_mark and tasks:
        # Inflation stops at the last task that keeps the request within the target, a hair short of
        # it: the end of the replay stands for the last mark.
        curve.append(CurvePoint(next_mark, 100 * (capacity - allocated) / capacity))
    if capacity - cluster.gpu_free_milli != allocated:  # the cluster's own books must agree
        raise AssertionError("allocated GPU share does not match the cluster's free share")
    return SharingResult(
        policy=name, tasks=len(tasks), curve=tuple(curve),
        unallocated_gpu_pct=100 * (capacity - allocated) / capacity,
        allocated_gpu_pct=100 * allocated / capacity, failed_tasks=failed,
        decision_ms_p50=1000 * statistics.median(timings) if timings else 0.0,
    )


def plot(results: list[SharingResult], path: Path, title: str) -> None:
    """Unallocated GPU % against arrived workload, one line per policy (the paper's Figure 9a)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4.5), dpi=120)
    for r in results:
        ax.plot([p.arrived_pct for p in r.curve], [p.unallocated_gpu_pct for p in r.curve], marker="o",
                label=f"{r.policy} ({r.at(100) if r.at(100) is not None else r.unallocated_gpu_pct:.1f} % at 100 %)")
    top = max((p.arrived_pct for r in results for p in r.curve), default=100)
    ax.plot([0, 100], [100, 0], linestyle=":", color="grey", label="ideal")
    ax.set_xlim(0, max(top, 100))
    ax.set_ylim(0, 100)
    ax.set_xlabel("arrived workload (% of cluster GPU capacity)")
    ax.set_ylabel("unallocated GPU (%)")
    ax.set_title(title)
    ax.grid(linestyle="-.", alpha=0.6)
    ax.legend(fontsize=8, loc="lower left")
    inset = ax.inset_axes((0.55, 0.45, 0.4, 0.3))
    for r in results:
        pts = [p for p in r.curve if p.arrived_pct >= 80]
        inset.plot([p.arrived_pct for p in pts], [p.unallocated_gpu_pct for p in pts], marker=".")
    inset.set_title("from 80 %", fontsize=7)
    inset.tick_params(labelsize=6)
    fig.tight_layout()
    try:
        fig.savefig(path)
    finally:
        plt.close(fig)
