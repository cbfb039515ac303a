"""The fair-share step: which queued gangs their teams' shares admit, and borrowed GPUs taken back at a checkpoint.

Once a step, before jobs are moved on, the fair-share policy (``policies/fair_share.py``) is asked
over the store as it is: the fleet's GPUs (``capacity_gpus``, else ``max_gpus``), what each team's
started gangs hold (gangs already giving theirs back excluded), its recent usage decayed with the
half-life (from its allocations), what is left of an enforced budget this period (from the ledger,
at the prices paid) and the queued gangs. Its answer:

- a queued gang it holds back waits, with why in its ``reason`` (``waiting: team a over its share``,
  ``waiting: budget: ...``, ``waiting: reclaiming 1 GPU from team b``); the engine's admission gate
  passes over it this step;
- a reclaim is carried out through the preemption path: the preemption policy (checkpoint-aware:
  for a reclaim the smallest gangs first, then the least work lost) picks, among the borrowing
  teams' running gangs on a cluster the owner's gang fits, those to checkpoint; they are asked to
  (CHECKPOINTING, ``preempted_by`` the owner), leave once the checkpoint is reported or their grace
  runs out, and are requeued to resume from it; the owner's gang claims their GPUs and starts as
  soon as they are free.

Nothing is kept between steps: the decision is made again from the store every step.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Callable
from dataclasses import replace
from datetime import datetime, timedelta

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from broker.config.teams import FairShareConfig
from broker.engine import machine, packing
from broker.engine.notices import open_notice
from broker.engine.parts import AfterCommit, Parts
from broker.errors import UserError
from broker.model import ACTIVE_STATES, ClusterState, JobState
from broker.reports.build import period_start
from broker.spec.job import JobSpec
from broker.store import Store
from broker.store.tables import AllocationRow, ClusterRow, JobRow, LedgerRow
from policies import kinds
from policies.fair_share import FairShareDecision, FairShareRequest, QueuedGang, Reclaim, TeamUsage
from policies.preemption import PreemptionRequest

Admit = Callable[[Session, JobRow], bool]

# The reasons this step writes on a job, cleared by it once they no longer hold.
WAITING, RECLAIMED, RECLAIMING = "waiting: ", "reclaimed: ", "reclaiming "
OURS = (WAITING, RECLAIMED, RECLAIMING)
DECAY_HORIZON = 10  # half-lives of usage looked back at (what is older weighs under 0.1 %)


class FairShare:
    """The engine's fair-share step and the admission gate it feeds."""

    def __init__(self, parts: Parts, config: FairShareConfig) -> None:
        self.parts = parts
        self.config = config
        self.policy = kinds.fair_share.get(config.policy, live=True)
        self.waiting: dict[str, str] = {}  # job id -> why it waits, this step
        self.last: FairShareDecision | None = None

    def gate(self, inner: Admit | None) -> Admit:
        """The admission gate: a gang the last decision holds back waits; the others pass to ``inner``."""
        def admit(s: Session, job: JobRow) -> bool:
            if job.id in self.waiting:
                return False
            return inner is None or inner(s, job)

        return admit

    def step(self) -> FairShareDecision:
        parts = self.parts
        after = AfterCommit()
        with parts.store.transaction() as s:
            jobs = list(s.scalars(select(JobRow).where(JobRow.state.in_(ACTIVE_STATES))))
            request = self.request(s, jobs, parts.clock.now())
            decision = self.policy(request)
            waiting = dict(decision.waits)
            by_id = {job.id: job for job in jobs}
            for reclaim in decision.reclaims:
                # Reclaimed, it heads for the borrowers' GPUs; if no cluster holds both its kind of GPUs
                # and the borrowers' gangs, it looks for room the usual way.
                self._reclaim(s, by_id[reclaim.job_id], reclaim, by_id, after)
                waiting.pop(reclaim.job_id, None)
            self._write_reasons(jobs, waiting)
            self.waiting = waiting
        after.carry_out(parts.provisioner)
        self.last = decision
        return decision

    def request(self, s: Session, jobs: list[JobRow], now: datetime) -> FairShareRequest:
        return build_request(s, self.config, jobs, now)

    def _reclaim(self, s: Session, owner: JobRow, reclaim: Reclaim, jobs: dict[str, JobRow],
                 after: AfterCommit) -> bool:
        """Borrowed GPUs taken back for ``owner`` through the preemption path; True if a plan was found."""
        parts = self.parts
        spec = parts.spec_of(owner)
        now = parts.clock.now()
        exempt = self.config.exempt_priority
        borrowers = set(reclaim.from_teams)
        for row in s.scalars(select(ClusterRow).where(ClusterRow.state == ClusterState.UP.value)
                             .order_by(ClusterRow.id)):
            per_node = packing.hosts(row, spec, owner)
            if per_node is None or open_notice(s, row.id, any_state=True) is not None:
                continue
            running = packing.running_gangs(s, row.id, now, parts.options.restart_overhead_s)
            # Borrowers' gangs become the candidates (priority below the owner's); the others are kept out.
            candidates = tuple(replace(g, priority=0) for g in running
                               if g.job_id in jobs and jobs[g.job_id].team in borrowers
                               and (exempt is None or g.priority < exempt))
            if not candidates:
                continue
            request = PreemptionRequest(packing.gang_request(owner, spec, per_node), 1, math.inf, reclaim=True)
            plan = parts.preemption(request, packing.snapshot(s, row), candidates)
            if plan is None:
                continue
            packing.checkpoint_victims(
                parts, s, after, row, plan.victims, owner.id, now, f"reclaimed by team {owner.team} for {owner.id}",
                lambda victim: f"{RECLAIMED}team {owner.team} takes back the GPUs team {victim.team} "
                               f"borrowed; checkpointing, then requeued to resume")
            owner.target_cluster_id, owner.target_gpus, owner.gpu_share = row.id, plan.placement.to_json(), None
            if owner.started_at is None:
                owner.started_at = now
            owner.reason = f"{RECLAIMING}{reclaim.gpus} GPU{'s' if reclaim.gpus != 1 else ''} from team " \
                           f"{', '.join(sorted({jobs[v].team for v in plan.victims}))}"
            machine.provisioning(s, parts.clock, owner, cluster=row.id, reclaiming=list(plan.victims),
                                 from_teams=sorted(borrowers), work_lost_gpu_s=plan.work_lost_gpu_s)
            return True
        return False

    @staticmethod
    def _write_reasons(jobs: list[JobRow], waiting: dict[str, str]) -> None:
        for job in jobs:
            why = waiting.get(job.id) if job.state == JobState.PENDING.value else None
            if why is not None:
                if job.reason != why:
                    job.reason = why
            elif job.reason is not None and job.reason.startswith(OURS) and not (
                    job.state == JobState.PROVISIONING.value and job.reason.startswith(RECLAIMING)) and not (
                    job.state == JobState.CHECKPOINTING.value and job.reason.startswith(RECLAIMED)):
                job.reason = None


def build_request(s: Session, config: FairShareConfig, jobs: list[JobRow], now: datetime) -> FairShareRequest:
    """The policy's request from the store: ``jobs`` are the active ones. A job's ``work`` is its predicted
    run time; a running one gives its GPUs back that long after its allocation began running (``releases``, and
    ``team_releases`` with its team)."""
    held: dict[str, int] = defaultdict(int)
    held_type: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    queued: list[QueuedGang] = []
    releases: list[tuple[float, int]] = []
    team_releases: list[tuple[str, float, int]] = []
    running_since: dict[str, datetime | None] = {
        job_id: at for job_id, at in s.execute(
            select(AllocationRow.job_id, func.max(AllocationRow.running_at))
            .where(AllocationRow.ended_at.is_(None), AllocationRow.running_at.is_not(None))
            .group_by(AllocationRow.job_id))}
    price = _paid_price_per_gpu_hour(s, period_start(now, config.budget_period)) if config.budgets else 0.0
    for order, job in enumerate(sorted(jobs, key=lambda j: (j.created_at, j.id))):
        gpus = job.num_nodes * job.gpus_per_node
        if gpus <= 0:
            continue
        if job.state == JobState.PENDING.value:
            cost = gpus * (job.work_s or 0.0) / 3600 * price
            queued.append(QueuedGang(job.id, job.team, gpus, job.priority, order, cost, runtime_s=job.work_s,
                                     gpu_type=job.accelerator))
        elif not (job.state == JobState.CHECKPOINTING.value and job.preempted_by is not None):
            held[job.team] += gpus
            if job.accelerator is not None:
                held_type[job.team][job.accelerator] += gpus
            began = running_since.get(job.id)
            if job.work_s is not None and began is not None:
                left_s = max(job.work_s - (now - began).total_seconds(), 0.0)
                releases.append((left_s, gpus))
                team_releases.append((job.team, left_s, gpus))
    usage = _decayed_usage(s, now, config.half_life_s)
    left = _budget_left(s, config, now)
    teams = set(held) | set(usage) | set(left) | {g.team for g in queued}
    return FairShareRequest(
        capacity_gpus=config.capacity_gpus, teams=config.teams,
        usage=tuple(TeamUsage(t, held.get(t, 0), usage.get(t, 0.0), left.get(t),
                              tuple(sorted(held_type[t].items())) if t in held_type else ())
                    for t in sorted(teams)),
        queued=tuple(queued), half_life_s=config.half_life_s, exempt_priority=config.exempt_priority,
        releases=tuple(releases), team_releases=tuple(team_releases))


def _decayed_usage(s: Session, now: datetime, half_life_s: float) -> dict[str, float]:
    """GPU-seconds each team's allocations ran, each second weighted 2^(-age / half-life)."""
    since = now - timedelta(seconds=half_life_s * DECAY_HORIZON)
    rows = s.execute(select(JobRow.team, AllocationRow.gpus, AllocationRow.gpu_share, AllocationRow.running_at,
                            AllocationRow.started_at, AllocationRow.ended_at)
                     .join(JobRow, JobRow.id == AllocationRow.job_id)
                     .where((AllocationRow.ended_at.is_(None)) | (AllocationRow.ended_at >= since)))
    rate = math.log(2) / half_life_s
    usage: dict[str, float] = defaultdict(float)
    for team, gpus, share, running_at, started_at, ended_at in rows:
        began = max(running_at or started_at, since)
        ended = min(ended_at or now, now)
        if ended <= began:
            continue
        count = sum(len(v) for v in (gpus or {}).values()) * (share or 1.0)
        age_end, age_start = (now - ended).total_seconds(), (now - began).total_seconds()
        usage[team] += count * (math.exp(-rate * age_end) - math.exp(-rate * age_start)) / rate
    return usage


def spent_by_team(s: Session, since: datetime) -> dict[str, float]:
    """USD each team's jobs were billed since ``since``, at the prices paid (the ledger)."""
    rows = s.execute(select(LedgerRow.team, func.sum(LedgerRow.cost)).where(
        LedgerRow.minute >= since, LedgerRow.team.is_not(None)).group_by(LedgerRow.team))
    return {str(team): float(total or 0.0) for team, total in rows}


def _budget_left(s: Session, config: FairShareConfig, now: datetime) -> dict[str, float]:
    if not config.budgets:
        return {}
    spent = spent_by_team(s, period_start(now, config.budget_period))
    return {team: budget - spent.get(team, 0.0) for team, budget in config.budgets}


def _paid_price_per_gpu_hour(s: Session, since: datetime) -> float:
    """The mean price paid per GPU-hour since ``since`` (0 before anything was billed)."""
    cost, gpu_s = s.execute(select(func.sum(LedgerRow.cost), func.sum(LedgerRow.gpus * LedgerRow.seconds))
                            .where(LedgerRow.minute >= since, LedgerRow.job_id.is_not(None))).one()
    return float(cost or 0.0) / (float(gpu_s) / 3600) if gpu_s else 0.0


class OverBudget(UserError):
    """A job refused at submission: its team's enforced budget would not cover it (``over_budget: refuse``)."""

    http_status = 403

    def __str__(self) -> str:
        return str(self.args[0])


def refuse_over_budget(store: Store, now: datetime, budgets: tuple[tuple[str, float], ...], period: str,
                       tasks: tuple[JobSpec, ...]) -> None:
    """Raise ``OverBudget`` when a task's predicted cost (its ``work`` at the price per GPU-hour paid this
    period) would take its team past its budget for the period, counting the tasks before it."""
    limits = dict(budgets)
    if not any(task.broker.team in limits for task in tasks):
        return
    since = period_start(now, period)
    with store.transaction() as s:
        spent = spent_by_team(s, since)
        price = _paid_price_per_gpu_hour(s, since)
    for task in tasks:
        team = task.broker.team
        if team not in limits:
            continue
        work_s = task.broker.work.total_seconds() if task.broker.work else 0.0
        cost = task.num_nodes * task.gpus_per_node * work_s / 3600 * price
        left = limits[team] - spent.get(team, 0.0)
        if left <= 0 or cost > left + 1e-9:
            raise OverBudget(f"budget: team {team} has ${max(left, 0.0):.2f} left of its ${limits[team]:.2f} "
                             f"{period}ly budget, and the job is predicted to cost ${cost:.2f}; refused")
        spent[team] = spent.get(team, 0.0) + cost
