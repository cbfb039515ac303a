"""Replaying a multi-team job trace against a fleet through a fair-share policy: what each team received
against what it was owed, the fleet's utilisation, waits, and work lost to reclaims.

The fleet is a pool of ``capacity`` GPUs stepped every ``step_s`` seconds, as the engine steps. Each
step the policy is asked the same ``FairShareRequest`` the live engine builds (GPUs each team holds,
its usage decayed with the half-life, the queued gangs in submission order): admitted gangs start;
for a reclaim the borrowers' running gangs are taken in the checkpoint-aware preemption policy's
order for a reclaim (the smallest first, then the least work lost), asked to checkpoint, and hand
their GPUs over once it is written (``checkpoint_s``); the owner's gang starts then, and the
borrower is requeued keeping its progress, paying ``restart_s`` when it resumes.

A job trace with teams: ``team,job_id,num_gpus,submit_time,duration,priority`` (seconds), built from
the Philly workloads by ``philly_teams``.
"""

from __future__ import annotations

import math
import random
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

from broker.sim.workload import read_workload
from policies.fair_share import FairSharePolicy, FairShareRequest, QueuedGang, Team, TeamUsage, owed_shares
from policies.placement import PlacementRequest
from policies.preemption import PreemptionRequest, RunningGang, victim_order


@dataclass(frozen=True, slots=True)
class TeamJob:
    team: str
    job_id: str
    gpus: int
    submit_s: float
    duration_s: float
    priority: int = 500


@dataclass
class _Run:
    job: TeamJob
    left_s: float  # work still to do
    started_s: float | None = None  # first start
    running_since: float | None = None  # this attempt's start (work begins after any restart)
    last_checkpoint_s: float = 0.0
    leaving_at: float | None = None  # a reclaim asked it to checkpoint; its GPUs go at this time
    waiting_for: float | None = None  # an owner's gang heading for reclaimed GPUs starts at this time
    restarts: int = 0
    ended_s: float | None = None


@dataclass
class TeamFigures:
    owed_gpu_s: float = 0.0
    received_gpu_s: float = 0.0
    borrowed_gpu_s: float = 0.0
    reclaims: int = 0  # of its gangs, giving GPUs back
    reclaimed_gpu_s: float = 0.0  # GPU-seconds its gangs spent checkpointing and restarting for reclaims
    waits_s: list[float] = field(default_factory=list)
    # (entitled - received) / entitled over the windows in which, throughout, it had work waiting and a share its
    # gangs can fill: entitled is what it holds plus its smallest waiting gangs that fit in what it is owed
    worst_window_error: float = 0.0
    windows: int = 0


@dataclass
class ReplayResult:
    policy: str
    utilisation: float  # GPU-seconds held / (capacity x span from first submit to last finish)
    makespan_s: float
    teams: dict[str, TeamFigures]
    handovers_s: list[float]  # from a reclaim's request to the owner's gang starting
    lost_per_reclaim_s: list[float]  # seconds of a reclaimed gang's time not spent on its work
    unfinished: int
    contended_utilisation: float = 0.0  # GPUs held / capacity, over the steps in which a gang waited

    @property
    def mean_wait_s(self) -> float:
        waits = [w for t in self.teams.values() for w in t.waits_s]
        return sum(waits) / len(waits) if waits else 0.0

    @property
    def worst_window_error(self) -> float:
        return max((t.worst_window_error for t in self.teams.values()), default=0.0)


def replay(jobs: list[TeamJob], teams: tuple[Team, ...], capacity: int, policy: FairSharePolicy, name: str,
           step_s: float = 60.0, half_life_s: float = 3600.0, checkpoint_s: float = 60.0, restart_s: float = 60.0,
           window_s: float = 3600.0, horizon_s: float = 14 * 86400.0) -> ReplayResult:
    runs = {j.job_id: _Run(j, j.duration_s) for j in sorted(jobs, key=lambda j: (j.submit_s, j.job_id))}
    order = {job_id: i for i, job_id in enumerate(runs)}
    figures: dict[str, TeamFigures] = defaultdict(TeamFigures)
    usage: dict[str, float] = defaultdict(float)
    handovers: list[float] = []
    lost: list[float] = []
    window: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0])  # team -> [owed, received] GPU-s
    backlogged: dict[str, bool] = {}
    held_gpu_s = 0.0
    contended = [0.0, 0.0]  # GPU-seconds held, and offered, while a gang waited
    first = min((j.submit_s for j in jobs), default=0.0)
    now = first
    decay = 0.5 ** (step_s / half_life_s)
    while now < first + horizon_s and any(r.ended_s is None for r in runs.values()):
        # GPUs handed over at a checkpoint; gangs done.
        for run in runs.values():
            if run.leaving_at is not None and run.leaving_at <= now:
                run.leaving_at, run.running_since = None, None
                run.last_checkpoint_s = now
            if run.waiting_for is not None and run.waiting_for <= now:
                run.waiting_for = None
                _start(run, now, restart_s)
            if run.running_since is not None and run.leaving_at is None and run.left_s <= 0 and run.ended_s is None:
                run.ended_s, run.running_since = now, None
        active = [r for r in runs.values() if r.ended_s is None and r.job.submit_s <= now]
        holding = [r for r in active if r.running_since is not None or r.waiting_for is not None]
        held: dict[str, int] = defaultdict(int)
        for run in holding:
            if run.leaving_at is None:
                held[run.job.team] += run.job.gpus
        queued = [r for r in active if r.running_since is None and r.waiting_for is None]
        request = FairShareRequest(
            capacity, teams,
            tuple(TeamUsage(t, held.get(t, 0), usage.get(t, 0.0)) for t in sorted(set(held) | set(usage))),
            tuple(QueuedGang(r.job.job_id, r.job.team, r.job.gpus, r.job.priority, order[r.job.job_id],
                             runtime_s=r.left_s + (restart_s if r.started_s is not None else 0.0))
                  for r in queued), half_life_s=half_life_s, releases=_releases(holding, now),
            team_releases=_team_releases(holding, now))
        decision = policy(request)
        for job_id in decision.admit:
            run = runs[job_id]
            # GPUs taken: an owner heading for reclaimed GPUs takes those its borrowers still hold, not more.
            if sum(r.job.gpus for r in holding if r.waiting_for is None) + run.job.gpus <= capacity:
                _start(run, now, restart_s)
                holding.append(run)
        for reclaim in decision.reclaims:
            owner = runs[reclaim.job_id]
            victims = _victims(holding, owner.job.job_id, set(reclaim.from_teams), reclaim.gpus, now, restart_s)
            if victims is None:
                continue
            for victim in victims:
                victim.leaving_at = now + checkpoint_s
                victim.restarts += 1
                lost.append(checkpoint_s + restart_s)
                figures[victim.job.team].reclaims += 1
                figures[victim.job.team].reclaimed_gpu_s += victim.job.gpus * (checkpoint_s + restart_s)
            owner.waiting_for = now + checkpoint_s
            handovers.append(checkpoint_s)
            holding.append(owner)
        # The step's figures, then time moves on.
        owed = owed_shares(request)
        in_use = sum(r.job.gpus for r in holding if r.running_since is not None)
        held_gpu_s += in_use * step_s
        if queued:
            contended[0] += in_use * step_s
            contended[1] += capacity * step_s
        entitled = _entitled(held, queued, owed)
        window_start = (now - first) % window_s < step_s / 2
        waiting_teams = {r.job.team for r in queued}
        present = set(owed) | set(held)
        for team in backlogged.keys() - present:
            backlogged[team] = False  # no work at all this step
        for team in present:
            received = sum(r.job.gpus for r in holding if r.job.team == team and r.running_since is not None)
            fig = figures[team]
            fig.owed_gpu_s += owed.get(team, 0.0) * step_s
            fig.received_gpu_s += received * step_s
            fig.borrowed_gpu_s += max(received - owed.get(team, 0.0), 0.0) * step_s
            window[team][0] += entitled.get(team, 0.0) * step_s
            window[team][1] += received * step_s
            # Throughout: a team first seen after the window's first step did not have work waiting all of it.
            backlogged[team] = backlogged.get(team, window_start) and team in waiting_teams \
                and entitled.get(team, 0.0) > 0
        for run in holding:
            if run.running_since is not None and run.leaving_at is None and now >= run.running_since:
                run.left_s -= step_s
        # Usage counts the GPUs running this step, those started by this step's decision too (as the engine
        # counts an allocation from when it runs).
        running: dict[str, int] = defaultdict(int)
        for run in holding:
            if run.running_since is not None:
                running[run.job.team] += run.job.gpus
        for team in set(usage) | set(running):
            usage[team] = usage[team] * decay + running.get(team, 0) * step_s
        now += step_s
        if (now - first) % window_s < step_s / 2:
            _close_window(window, backlogged, figures)
    for run in runs.values():
        if run.started_s is not None:
            figures[run.job.team].waits_s.append(run.started_s - run.job.submit_s)
    ended = [r.ended_s for r in runs.values() if r.ended_s is not None]
    span = (max(ended) if ended else now) - first
    return ReplayResult(name, held_gpu_s / (capacity * span) if span > 0 else 0.0, span, dict(figures), handovers,
                        lost, sum(r.ended_s is None for r in runs.values()),
                        contended[0] / contended[1] if contended[1] else 0.0)


def _releases(holding: list[_Run], now: float) -> tuple[tuple[float, int], ...]:
    """When the gangs holding GPUs give them back, by the work they have left (the replay's estimate is exact)."""
    ends = []
    for run in holding:
        if run.leaving_at is None:
            begins = _begins(run, now)
            ends.append((max(begins - now, 0.0) + max(run.left_s, 0.0), run.job.gpus))
    return tuple(ends)


def _team_releases(holding: list[_Run], now: float) -> tuple[tuple[str, float, int], ...]:
    """The same ends, each with the team whose gang gives its GPUs back."""
    ends = []
    for run in holding:
        if run.leaving_at is None:
            begins = _begins(run, now)
            ends.append((run.job.team, max(begins - now, 0.0) + max(run.left_s, 0.0), run.job.gpus))
    return tuple(ends)


def _begins(run: _Run, now: float) -> float:
    """When the gang's work (re)starts: an owner's gang when its reclaimed GPUs come, a restarting one after its
    restore, a running one now (a ``running_since`` of 0.0, a trace's first second, is a time like any other)."""
    if run.waiting_for is not None:
        return run.waiting_for
    return run.running_since if run.running_since is not None else now


def _start(run: _Run, now: float, restart_s: float) -> None:
    if run.started_s is None:
        run.started_s = now
        run.running_since = now
    else:
        run.running_since = now + restart_s  # restoring from its checkpoint first


def _entitled(held: dict[str, int], queued: list[_Run], owed: dict[str, float]) -> dict[str, float]:
    """Per team, the GPUs of its share its gangs can fill: what it holds, plus its smallest waiting gangs while
    they fit in what it is owed (all it is owed, if it holds that much already)."""
    waiting: dict[str, list[int]] = defaultdict(list)
    for run in queued:
        waiting[run.job.team].append(run.job.gpus)
    entitled: dict[str, float] = {}
    for team, mine in owed.items():
        total = float(held.get(team, 0))
        if total >= mine:
            entitled[team] = mine
            continue
        for gpus in sorted(waiting.get(team, [])):
            if total + gpus > mine + 1e-9:
                break
            total += gpus
        entitled[team] = total
    return entitled


def _victims(holding: list[_Run], owner: str, teams: set[str], need: int, now: float,
             restart_s: float) -> list[_Run] | None:
    """Borrowers' running gangs in the order the checkpoint-aware preemption policy takes them for a reclaim
    (the smallest first, then the least work lost), until ``need`` GPUs are freed; None if they cannot free
    that many."""
    candidates = {r.job.job_id: r for r in holding if r.job.team in teams and r.running_since is not None
                  and r.leaving_at is None}
    # A gang still restoring from its checkpoint has lost nothing since it: only its restart.
    gangs = tuple(RunningGang(job_id, 0, r.job.gpus, max(now - max(r.last_checkpoint_s, r.running_since or 0.0), 0.0),
                              restart_s) for job_id, r in candidates.items())
    chosen, freed = [], 0
    for gang in victim_order(PreemptionRequest(PlacementRequest(owner, need), 1, math.inf, reclaim=True),
                             gangs):
        if freed >= need:
            break
        chosen.append(candidates[gang.job_id])
        freed += gang.gpus
    return chosen if freed >= need else None


def _close_window(window: dict[str, list[float]], backlogged: dict[str, bool], figures: dict[str, TeamFigures]) -> None:
    for team, (owed, received) in window.items():
        if backlogged.get(team) and owed > 0:
            fig = figures[team]
            fig.windows += 1
            fig.worst_window_error = max(fig.worst_window_error, max(owed - received, 0.0) / owed)
    window.clear()
    backlogged.clear()


# --- the multi-team traces built from the Philly workloads ---

PHILLY_TEAMS = (Team("vision", weight=2.0), Team("nlp"), Team("speech"), Team("rl"))
STEADY = {"vision": 1, "nlp": 2}  # team -> Philly workload, submits spread over the day
BURSTY = {"speech": 3, "rl": 4}  # team -> Philly workload, submitted in three bursts
DAY_S = 86400.0
BURSTS = 3
BURST_S = 600.0
MAX_DURATION_S = 4 * 3600.0


def philly_teams(traces: Path, seed: int = 31) -> list[TeamJob]:
    """Four teams from the four Philly workloads (``workload-N.csv``): ``vision`` (weight 2) and ``nlp``
    submit steadily, their workloads' submit times stretched over a day; ``speech`` and ``rl`` are
    bursty: each job, by a generator seeded with ``seed``, goes to one of the team's three bursts at
    random hours of the day and is submitted within ten minutes of its start. Gang sizes are the
    trace's; durations are capped at four hours so that a day's replay ends."""
    rng = random.Random(seed)
    jobs: list[TeamJob] = []
    for team, number in STEADY.items():
        workload = read_workload(traces / "philly" / f"workload-{number}.csv")
        span = max(j.submit_s for j in workload) or 1.0
        for job in workload:
            jobs.append(TeamJob(team, f"{team}-{job.job_id}", job.gpus, job.submit_s / span * DAY_S,
                                min(job.duration_s, MAX_DURATION_S)))
    for team, number in BURSTY.items():
        starts = sorted(rng.uniform(0, DAY_S - BURST_S) for _ in range(BURSTS))
        for job in read_workload(traces / "philly" / f"workload-{number}.csv"):
            at = rng.choice(starts) + rng.uniform(0, BURST_S)
            jobs.append(TeamJob(team, f"{team}-{job.job_id}", job.gpus, at, min(job.duration_s, MAX_DURATION_S)))
    return sorted(jobs, key=lambda j: (j.submit_s, j.job_id))


def percentile(values: list[float], q: float) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))]
