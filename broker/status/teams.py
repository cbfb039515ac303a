"""What each team is owed and holds now: the figures ``broker teams``, ``GET /v1/teams`` and ``/metrics`` show.

Per team: GPUs owed by its share now (the fair-share policy's division among the teams with work),
held (its started gangs), borrowed (held past what it is owed), its queued gangs and how many of
them wait for a fair-share reason, its recent usage (GPU-hours decayed with the half-life), what is
left of an enforced budget this period, and its reclaims: gangs of it that gave GPUs back, and
gangs of it that took them back, with the work the reclaimed gangs lost.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import asdict, dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import select

from broker.config.teams import FairShareConfig
from broker.engine.fair_share import OURS, build_request
from broker.model import ACTIVE_STATES, JobState
from broker.store import Store
from broker.store.tables import JobEventRow, JobRow
from policies.fair_share import owed_shares


@dataclass(frozen=True)
class TeamLine:
    team: str
    weight: float
    owed_gpus: float
    held_gpus: int
    borrowed_gpus: float
    queued: int
    waiting: int  # queued gangs the fair-share step holds back (share, limit, budget, reclaim)
    usage_gpu_hours: float  # decayed with the half-life
    budget_left: float | None
    reclaims_given: int  # its gangs asked to checkpoint so an owner could take its GPUs back
    reclaims_taken: int  # its gangs that took borrowed GPUs back
    work_lost_s: float  # work its reclaimed gangs lost, in total (seconds of the gang's time)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def team_lines(store: Store, config: FairShareConfig, now: datetime) -> list[TeamLine]:
    with store.transaction() as s:
        jobs = list(s.scalars(select(JobRow).where(JobRow.state.in_(ACTIVE_STATES))))
        request = build_request(s, config, jobs, now)
        given: dict[str, int] = defaultdict(int)
        taken: dict[str, int] = defaultdict(int)
        lost: dict[str, float] = defaultdict(float)
        reclaimed_jobs: set[str] = set()
        rows = s.execute(select(JobRow.id, JobRow.team, JobEventRow.to_state, JobEventRow.detail)
                         .join(JobEventRow, JobEventRow.job_id == JobRow.id)
                         .where(JobEventRow.kind == "transition",
                                JobEventRow.to_state.in_([JobState.CHECKPOINTING.value,
                                                          JobState.PROVISIONING.value])))
        for job_id, team, to_state, detail in rows:
            detail = detail or {}
            if to_state == JobState.CHECKPOINTING.value and str(detail.get("reason", "")).startswith("reclaimed by"):
                given[team] += 1
                reclaimed_jobs.add(job_id)
            elif to_state == JobState.PROVISIONING.value and detail.get("reclaiming"):
                taken[team] += 1
        for team, work_lost in s.execute(select(JobRow.team, JobRow.work_lost_s)
                                                 .where(JobRow.id.in_(reclaimed_jobs))):
            lost[team] += float(work_lost or 0.0)
    owed = owed_shares(request)
    weights = {t.name: t.weight for t in config.teams}
    usage = {u.team: u for u in request.usage}
    queued: dict[str, int] = defaultdict(int)
    waiting: dict[str, int] = defaultdict(int)
    for job in jobs:
        if job.state == JobState.PENDING.value and job.num_nodes * job.gpus_per_node > 0:
            queued[job.team] += 1
            if job.reason is not None and job.reason.startswith(OURS):
                waiting[job.team] += 1
    names = sorted(set(weights) | set(usage) | set(given) | set(taken))
    lines = []
    for team in names:
        held = usage[team].held_gpus if team in usage else 0
        mine = owed.get(team, 0.0)
        left = usage[team].budget_left if team in usage else None
        lines.append(TeamLine(
            team=team, weight=weights.get(team, 1.0), owed_gpus=round(mine, 3), held_gpus=held,
            borrowed_gpus=round(max(held - mine, 0.0), 3), queued=queued[team], waiting=waiting[team],
            usage_gpu_hours=round(usage[team].decayed_gpu_s / 3600, 3) if team in usage else 0.0,
            budget_left=None if left is None else round(left, 2),
            reclaims_given=given[team], reclaims_taken=taken[team], work_lost_s=round(lost[team], 1)))
    return lines
