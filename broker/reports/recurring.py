"""What earlier runs of a recurring job (same name and team) tell its right-sizing.

- **Its measured figures, pooled** (``pooled``): over the job's last ``HISTORY_RUNS`` finished runs
  on the same GPU type and count, up to its own end and itself included, the highest peak memory
  any of them reached and the utilisation over all their measured GPU time. One run's peak may be
  a lucky one; the advice must fit every run seen.
- **Its speed on each GPU type** (``measured_speeds``): where its runs (or its attempts, migrated
  between types) reported progress on several GPU types, the seconds per step of each attempt past
  its warm-up (``policies.prediction.seconds_per_step``), by the type of the cluster that attempt
  ran on; ``policies.rightsizing.speeds_from_step_times`` makes them relative speeds.

Read in a few queries for all the jobs of a report at once, not per job.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from typing import Any

from sqlalchemy import func, select

from broker.model import JobState
from broker.store.gpu import GpuRollupRow
from broker.store.tables import AllocationRow, ClusterRow, JobRow, ProgressRow
from policies.prediction import ProgressPoint, seconds_per_step
from policies.rightsizing import speeds_from_step_times

FINISHED = tuple(state.value for state in JobState if state.terminal)
HISTORY_RUNS = 20  # the runs of a recurring job pooled at most, newest first
PROGRESS_ROWS = 200_000  # progress reports read at most for the speeds of one report

Family = tuple[str, str]  # (name, team)


@dataclass(frozen=True, slots=True)
class Pooled:
    runs: int
    seconds: float  # measured GPU-seconds
    utilization_seconds: float
    peak_memory_mb: float | None
    memory_total_mb: float | None


def _family_jobs(session: Any, jobs: list[JobRow]) -> list[Any]:
    names, teams = {j.name for j in jobs}, {j.team for j in jobs}
    families = {(j.name, j.team) for j in jobs}
    rows = session.execute(select(JobRow.id, JobRow.name, JobRow.team, JobRow.state, JobRow.accelerator,
                                  JobRow.num_nodes, JobRow.gpus_per_node,
                                  func.coalesce(JobRow.finished_at, JobRow.updated_at).label("ended_at"))
                           .where(JobRow.name.in_(sorted(names)), JobRow.team.in_(sorted(teams))))
    return [r for r in rows if (r.name, r.team) in families]


def pooled(session: Any, jobs: list[JobRow]) -> dict[str, Pooled]:
    """Per finished job: its measured figures pooled with its earlier runs' (itself alone if it has none)."""
    finished = [j for j in jobs if j.state in FINISHED]
    if not finished:
        return {}
    family = [r for r in _family_jobs(session, finished) if r.state in FINISHED]
    R = GpuRollupRow
    sums = {row[0]: row[1:] for row in session.execute(
        select(R.job_id, func.sum(R.measured_seconds), func.sum(R.utilization_seconds), func.max(R.peak_memory_mb),
               func.max(R.memory_total_mb)).where(R.job_id.in_(sorted({r.id for r in family})))
        .group_by(R.job_id))}
    out = {}
    for job in finished:
        runs = sorted((r for r in family if (r.name, r.team, r.accelerator, r.num_nodes, r.gpus_per_node) ==
                       (job.name, job.team, job.accelerator, job.num_nodes, job.gpus_per_node)
                       and r.ended_at <= (job.finished_at or job.updated_at) and r.id in sums),
                      key=lambda r: (r.ended_at, r.id), reverse=True)
        runs = ([r for r in runs if r.id == job.id] + [r for r in runs if r.id != job.id])[:HISTORY_RUNS]
        if not runs or runs[0].id != job.id:
            continue  # the job itself was not measured: no advice from others' figures alone
        figures = [sums[r.id] for r in runs]
        peaks = [f[2] for f in figures if f[2] is not None]
        totals = [f[3] for f in figures if f[3] is not None]
        out[job.id] = Pooled(len(runs), sum(float(f[0] or 0.0) for f in figures),
                             sum(float(f[1] or 0.0) for f in figures), max(peaks) if peaks else None,
                             max(totals) if totals else None)
    return out


def measured_speeds(session: Any, jobs: list[JobRow]) -> dict[Family, dict[str, float]]:
    """Per (name, team): its relative speed on each GPU type its runs reported progress on, where two or more."""
    family = _family_jobs(session, jobs)
    if not family:
        return {}
    of_job = {r.id: (r.name, r.team) for r in family}
    gpu_of: dict[tuple[str, int], str] = {}
    types: dict[Family, set[str]] = defaultdict(set)
    for job_id, attempt, accelerator in session.execute(
            select(AllocationRow.job_id, AllocationRow.attempt, ClusterRow.accelerator)
            .join(ClusterRow, ClusterRow.id == AllocationRow.cluster_id)
            .where(AllocationRow.job_id.in_(sorted(of_job)))):
        if accelerator:
            gpu_of[(job_id, attempt)] = accelerator
            types[of_job[job_id]].add(accelerator)
    several = sorted(j for j in of_job if len(types[of_job[j]]) >= 2)
    if not several:
        return {}
    points: dict[tuple[str, int], list[ProgressPoint]] = defaultdict(list)
    for job_id, attempt, step, at in session.execute(
            select(ProgressRow.job_id, ProgressRow.attempt, ProgressRow.step, ProgressRow.at)
            .where(ProgressRow.job_id.in_(several)).order_by(ProgressRow.job_id, ProgressRow.attempt, ProgressRow.at)
            .limit(PROGRESS_ROWS)):
        points[(job_id, attempt)].append(ProgressPoint(at.timestamp(), int(step), attempt))
    step_seconds: dict[Family, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    for key, attempt_points in points.items():
        gpu = gpu_of.get(key)
        if gpu is not None:
            step_seconds[of_job[key[0]]][gpu].extend(seconds_per_step(tuple(attempt_points)))
    return {f: speeds for f, by_gpu in step_seconds.items() if (speeds := speeds_from_step_times(by_gpu))}
