"""Replay a job trace on one fixed cluster through a placement policy and measure the outcome.

Scheduling is first-come first-served with head-of-line blocking (as PAL's FIFO baseline): at every
arrival or completion the oldest waiting job is placed if the policy finds it GPUs, then the next,
until one does not fit. Every policy sees the same queue; what differs is where it puts each gang,
hence how fast the gang runs (``broker.sim.speed``) and what holes it leaves for the next ones.
Placements are kept until the job ends (no migration). A job needing more GPUs than the cluster has
is skipped and counted, never run.

Each job asks for its GPUs anywhere, preferring one node when it fits in one and one placement group
otherwise (a preference, not a requirement, so every policy can always place it once enough GPUs
are free). When the speed model is measured, every request also carries the measured step time per
split of the job's model (``SpeedModel.split_costs``); only ``topology`` reads it.

Measures:

- ``avg_jct_s``, ``p95_jct_s``: job completion time, finish minus submit;
- ``makespan_s``: first submit to last finish;
- ``utilization``: GPU-seconds held by jobs over cluster GPU-seconds in the makespan;
  ``useful_utilization`` counts only the ideal-placement GPU-seconds (slowdown excluded);
- ``stranded_gpus``: time-averaged free GPUs on partly occupied nodes while jobs wait (zero
  while the queue is empty): idle GPUs scattered in holes that a waiting gang could use only by
  splitting across nodes, where a tighter packing would have kept them together as whole nodes;
- ``splits`` / ``avoidable_splits``: gangs placed on several nodes / on more nodes than the fewest
  whose free GPUs could have held them at that moment;
- ``decision_ms_median``: median wall time of one placement call.
"""

from __future__ import annotations

import heapq
import statistics
import time
from collections import deque
from collections.abc import Callable
from dataclasses import asdict, dataclass

from broker.errors import BrokerError
from broker.sim.speed import SpeedModel
from broker.sim.workload import TraceJob
from policies.gang import GangPlacement
from policies.placement import LEVEL_GROUP, LEVEL_NODE, ClusterSnapshot, PlacementRequest, fewest_nodes

Placer = Callable[[PlacementRequest, ClusterSnapshot], GangPlacement | None]


class SimulationStuck(BrokerError, RuntimeError):
    pass


@dataclass(frozen=True, slots=True)
class PlacementResult:
    policy: str
    jobs: int
    skipped_jobs: int
    avg_jct_s: float
    p95_jct_s: float
    makespan_s: float
    utilization: float
    useful_utilization: float
    stranded_gpus: float
    splits: int
    avoidable_splits: int
    mean_slowdown: float
    decision_ms_median: float

    def to_json(self) -> dict[str, float | int | str]:
        return asdict(self)


@dataclass(frozen=True, slots=True)
class _Run:
    job: TraceJob
    placement: GangPlacement
    start_s: float
    end_s: float
    slowdown: float


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    if not ordered:
        return 0.0
    pos = (len(ordered) - 1) * q
    lo = int(pos)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


def _stranded(cluster: ClusterSnapshot, queue: deque[TraceJob]) -> int:
    if not queue:
        return 0
    g = cluster.topology.gpus
    return sum(c for m in cluster.free_masks if 0 < (c := m.bit_count()) < g)


def simulate(jobs: list[TraceJob], cluster: ClusterSnapshot, policy_name: str, placer: Placer,
             speed: SpeedModel, seed: int = 0) -> PlacementResult:
    """Replay ``jobs`` (submit order) on ``cluster`` (normally empty) with ``placer``."""
    total = cluster.total_gpus
    g = cluster.topology.gpus
    runnable = [j for j in jobs if j.gpus <= total]
    skipped = len(jobs) - len(runnable)
    arrivals = deque(sorted(runnable, key=lambda j: j.submit_s))
    queue: deque[TraceJob] = deque()
    ends: list[tuple[float, int, str]] = []
    running: dict[str, _Run] = {}
    done: list[_Run] = []
    decisions_ms: list[float] = []
    splits = avoidable = 0
    held = 0
    held_gpu_s = stranded_gpu_s = 0.0
    now = arrivals[0].submit_s if arrivals else 0.0
    first_submit = now
    seq = 0
    while arrivals or ends or queue:
        next_arrival = arrivals[0].submit_s if arrivals else float("inf")
        next_end = ends[0][0] if ends else float("inf")
        upcoming = min(next_arrival, next_end)
        if upcoming == float("inf"):
            raise SimulationStuck(f"job {queue[0].job_id} ({queue[0].gpus} GPUs) can never be placed")
        span = upcoming - now
        held_gpu_s += held * span
        stranded_gpu_s += _stranded(cluster, queue) * span
        now = upcoming
        while ends and ends[0][0] <= now:
            _, _, job_id = heapq.heappop(ends)
            run = running.pop(job_id)
            cluster = cluster.without_job(job_id)
            held -= run.job.gpus
            done.append(run)
        while arrivals and arrivals[0].submit_s <= now:
            queue.append(arrivals.popleft())
        while queue:
            job = queue[0]
            request = PlacementRequest(job.job_id, job.gpus, level=LEVEL_NODE if job.gpus <= g else LEVEL_GROUP,
                                       seed=seed, measured=speed.split_costs(job.model))
            t0 = time.perf_counter_ns()
            placement = placer(request, cluster)
            decisions_ms.append((time.perf_counter_ns() - t0) / 1e6)
            if placement is None:
                break
            if placement.gpu_count != job.gpus:
                raise SimulationStuck(f"{policy_name} gave job {job.job_id} {placement.gpu_count} of {job.gpus} GPUs")
            queue.popleft()
            nodes = len(placement.nodes)
            if nodes > 1:
                splits += 1
                fewest = fewest_nodes(cluster, job.gpus)
                if fewest is not None and nodes > fewest:
                    avoidable += 1
            slowdown = speed.slowdown(job.model, job.gpus, placement, cluster)
            cluster = cluster.with_placement(job.job_id, placement)
            held += job.gpus
            end = now + job.duration_s * slowdown
            running[job.job_id] = _Run(job, placement, now, end, slowdown)
            seq += 1
            heapq.heappush(ends, (end, seq, job.job_id))
    makespan = (max(r.end_s for r in done) - first_submit) if done else 0.0
    jcts = [r.end_s - r.job.submit_s for r in done]
    capacity = total * makespan
    return PlacementResult(
        policy=policy_name,
        jobs=len(done),
        skipped_jobs=skipped,
        avg_jct_s=statistics.fmean(jcts) if jcts else 0.0,
        p95_jct_s=_percentile(jcts, 0.95),
        makespan_s=makespan,
        utilization=held_gpu_s / capacity if capacity else 0.0,
        useful_utilization=sum(r.job.gpus * r.job.duration_s for r in done) / capacity if capacity else 0.0,
        stranded_gpus=stranded_gpu_s / makespan if makespan else 0.0,
        splits=splits,
        avoidable_splits=avoidable,
        mean_slowdown=statistics.fmean(r.slowdown for r in done) if done else 1.0,
        decision_ms_median=statistics.median(decisions_ms) if decisions_ms else 0.0,
    )
