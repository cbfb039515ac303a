"""The report's section per team under fair share: share received against share owed, reclaims, and the jobs
that spent the last of a budget.

From the ledger and the jobs' events over the report's window: a team's GPU-hours running, its share
of all GPU-hours run, the share its weight gave it among the teams that ran in the window (the
hierarchy included), reclaims it gave and took and the work its reclaimed jobs lost, and, for a
team with a budget, the jobs running in the minute its spend this period reached the budget.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import asdict, dataclass, field
from typing import Any

from sqlalchemy import func, select

from broker.config.teams import FairShareConfig
from broker.model import JobState
from broker.reports.build import period_start
from broker.reports.window import Window
from broker.store import Store
from broker.store.tables import JobEventRow, JobRow, LedgerRow
from policies.fair_share import FairShareRequest, TeamUsage, owed_shares

FLEET = 1_000_000  # GPUs of the notional fleet the shares are fractions of


@dataclass(frozen=True)
class TeamShare:
    team: str
    gpu_hours: float
    share_received: float  # of all GPU-hours run in the window
    share_owed: float  # by weight, among the teams that ran in it
    reclaims_given: int
    reclaims_taken: int
    work_lost_hours: float  # by its jobs reclaimed in the window
    budget_spent_by: list[str] = field(default_factory=list)  # jobs running when the budget ran out

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def team_shares(store: Store, window: Window, config: FairShareConfig,
                budgets: tuple[tuple[str, float], ...] = (), period: str = "month") -> list[TeamShare]:
    with store.transaction() as s:
        hours = {str(team): float(total or 0.0) / 3600 for team, total in s.execute(
            select(LedgerRow.team, func.sum(LedgerRow.gpus * LedgerRow.seconds))
            .where(LedgerRow.minute >= window.start, LedgerRow.minute < window.end, LedgerRow.team.is_not(None),
                   LedgerRow.usage == "running").group_by(LedgerRow.team))}
        given: dict[str, int] = defaultdict(int)
        taken: dict[str, int] = defaultdict(int)
        lost: dict[str, float] = defaultdict(float)
        for team, to_state, detail, work_lost in s.execute(
                select(JobRow.team, JobEventRow.to_state, JobEventRow.detail, JobRow.work_lost_s)
                .join(JobEventRow, JobEventRow.job_id == JobRow.id)
                .where(JobEventRow.kind == "transition", JobEventRow.at >= window.start, JobEventRow.at < window.end,
                       JobEventRow.to_state.in_([JobState.CHECKPOINTING.value, JobState.PROVISIONING.value]))):
            detail = detail or {}
            if to_state == JobState.CHECKPOINTING.value and str(detail.get("reason", "")).startswith("reclaimed by"):
                given[team] += 1
                lost[team] += float(work_lost or 0.0) / 3600
            elif to_state == JobState.PROVISIONING.value and detail.get("reclaiming"):
                taken[team] += 1
        last = {team: _spent_the_last(s, team, budget, period_start(window.end, period), window.end)
                for team, budget in budgets}
    total = sum(hours.values())
    # Owed: the division the policy makes when every team that ran has more work than the fleet holds.
    ran = tuple(TeamUsage(team, FLEET) for team in sorted(hours) if hours[team] > 0)
    owed = owed_shares(FairShareRequest(FLEET, config.teams, ran, ())) if ran else {}
    teams = sorted(set(hours) | set(given) | set(taken) | set(last))
    return [TeamShare(team, round(hours.get(team, 0.0), 3),
                      round(hours.get(team, 0.0) / total, 4) if total else 0.0,
                      round(owed.get(team, 0.0) / FLEET, 4), given[team], taken[team], round(lost[team], 3),
                      last.get(team) or [])
            for team in teams]


def _spent_the_last(s: Any, team: str, budget: float, since: Any, until: Any) -> list[str]:
    """The jobs billed in the minute the team's spend since ``since`` first reached ``budget``."""
    spent = 0.0
    rows = s.execute(select(LedgerRow.minute, func.sum(LedgerRow.cost))
                     .where(LedgerRow.team == team, LedgerRow.minute >= since, LedgerRow.minute < until)
                     .group_by(LedgerRow.minute).order_by(LedgerRow.minute))
    for minute, cost in rows:
        spent += float(cost or 0.0)
        if spent >= budget:
            return sorted(str(j) for j in s.scalars(select(LedgerRow.job_id).distinct().where(
                LedgerRow.team == team, LedgerRow.minute == minute, LedgerRow.job_id.is_not(None))))
    return []
