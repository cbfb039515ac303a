"""Teams in the settings (``teams:``, or ``BROKER_TEAMS`` as JSON): weights, quotas, limits and a hierarchy.

``teams: {nlp: {weight: 2, quota_gpus: 4, limit_gpus: 16, parent: research}}``. A team not named
shares a default weight of 1. Refused at load, naming the field: a weight that is not a positive
finite number, a negative or huge quota or limit, a quota above the limit, a parent that is not a
named team, a cycle of parents, a name that is empty, too long or holds control characters.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

from broker.spec.values import MAX_TEAM_CHARS
from policies.fair_share import Team

MAX_TEAMS = 1000
MAX_TEAM_GPUS = 1_000_000
MAX_DEPTH = 16  # of the hierarchy
MAX_JSON_CHARS = 1_000_000
MAX_JSON_DEPTH = 8


MAX_GPU_TYPES = 100


def _gpus(value: Any, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int | float) or \
            (isinstance(value, float) and not (math.isfinite(value) and value.is_integer())):
        shown = repr(value)[:40] if isinstance(value, int | float | str) else type(value).__name__
        raise ValueError(f"{where}expected a whole number of GPUs (or a mapping {{GPU type: GPUs}}), got {shown}")
    if not 0 <= value <= MAX_TEAM_GPUS:
        raise ValueError(f"{where}expected GPUs between 0 and {MAX_TEAM_GPUS}, got {value:g}")
    return int(value)


def check_team_name(name: str) -> str:
    shown = repr(name[:60])
    if not name.strip() or name != name.strip():
        raise ValueError(f"team name {shown}: expected a non-empty name without surrounding spaces")
    if len(name) > MAX_TEAM_CHARS:
        raise ValueError(f"team name {shown}...: expected at most {MAX_TEAM_CHARS} characters, got {len(name)}")
    if any(not ch.isprintable() or 0xD800 <= ord(ch) <= 0xDFFF for ch in name):
        raise ValueError(f"team name {name[:60].encode('unicode_escape', 'backslashreplace').decode()!r}: "
                         "expected printable characters only")
    return name


class TeamSettings(BaseModel):
    """One team's claim on the fleet."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False, strict=False)

    weight: float = Field(1.0, gt=0, le=1e6, description="its part of its parent's (or the fleet's) GPUs")
    quota_gpus: int | dict[str, int] | None = Field(
        None, description="GPUs guaranteed while it has work: in total, or per GPU type ({A100: 4})")
    limit_gpus: int | None = Field(None, ge=0, le=MAX_TEAM_GPUS, description="never more GPUs than this")
    parent: str | None = Field(None, description="the team (a department) whose share this one divides")

    @field_validator("weight", mode="before")
    @classmethod
    def _number(cls, value: Any) -> Any:
        if isinstance(value, bool) or not isinstance(value, int | float | str):
            raise ValueError(f"expected a positive number, got {type(value).__name__}")
        return value

    @field_validator("quota_gpus", mode="before")
    @classmethod
    def _quota(cls, value: Any) -> int | dict[str, int] | None:
        """A whole number of GPUs, or a mapping {GPU type: whole number}; anything else refused here, in one
        line naming the type, rather than as both arms of the union."""
        if value is None:
            return None
        if isinstance(value, dict):
            if len(value) > MAX_GPU_TYPES:
                raise ValueError(f"expected at most {MAX_GPU_TYPES} GPU types, got {len(value)}")
            quotas = {}
            for gpu, count in value.items():
                if not isinstance(gpu, str) or not gpu or len(gpu) > 50 or not gpu.isascii() or \
                        not gpu.replace("-", "").replace("_", "").isalnum():
                    raise ValueError(f"expected a GPU type like A100, got {str(gpu)[:60]!r}")
                quotas[gpu] = _gpus(count, f"{gpu}: ")
            return quotas
        return _gpus(value, "")

    @field_validator("parent", mode="after")
    @classmethod
    def _parent_name(cls, value: str | None) -> str | None:
        return None if value is None else check_team_name(value)

    @property
    def total_quota(self) -> int | None:
        if isinstance(self.quota_gpus, dict):
            return sum(self.quota_gpus.values())
        return self.quota_gpus


def teams_from_json(text: str) -> Any:
    """``BROKER_TEAMS``: a JSON object, bounded in size and depth before it is parsed."""
    if len(text) > MAX_JSON_CHARS:
        raise ValueError(f"expected a JSON object of at most {MAX_JSON_CHARS} characters, got {len(text)}")
    depth = deepest = 0
    for ch in text:  # a team is three levels deep ({team: {quota_gpus: {A100: 4}}}); refuse far deeper at once
        depth += ch in "[{"
        depth -= ch in "]}"
        deepest = max(deepest, depth)
    if deepest > MAX_JSON_DEPTH:
        raise ValueError(f"expected a JSON object like {{\"nlp\": {{\"weight\": 2}}}}, nested {deepest} deep")
    try:
        return json.loads(text)
    except ValueError as exc:
        raise ValueError(f"expected a JSON object like {{\"nlp\": {{\"weight\": 2}}}}: {exc}") from None


def check_teams(teams: dict[str, TeamSettings]) -> dict[str, TeamSettings]:
    """The whole mapping: names, parents that exist, no cycle, not too deep, quotas within limits."""
    if len(teams) > MAX_TEAMS:
        raise ValueError(f"expected at most {MAX_TEAMS} teams, got {len(teams)}")
    for name, team in teams.items():
        check_team_name(name)
        quota = team.total_quota
        if quota is not None and team.limit_gpus is not None and quota > team.limit_gpus:
            raise ValueError(f"{name}.quota_gpus: {quota} GPUs guaranteed is more than its "
                             f"limit_gpus {team.limit_gpus}")
        if team.parent is not None and team.parent not in teams:
            raise ValueError(f"{name}.parent: unknown team {team.parent[:60]!r}; a parent must be a named team")
    for name in teams:
        chain = [name]
        while (parent := teams[chain[-1]].parent) is not None:
            if parent in chain:
                raise ValueError(f"{name}.parent: a cycle in the hierarchy: {' -> '.join([*chain, parent])}")
            chain.append(parent)
            if len(chain) > MAX_DEPTH:
                raise ValueError(f"{name}.parent: a hierarchy deeper than {MAX_DEPTH} teams")
    return teams


@dataclass(frozen=True)
class FairShareConfig:
    """What the engine's fair-share step runs with (None of it when no team is named)."""

    teams: tuple[Team, ...]
    policy: str | None = None  # None: the registry's default, weighted_fair_share
    half_life_s: float = 3600.0
    capacity_gpus: int | None = None  # the fleet: capacity_gpus, else max_gpus; None: unbounded
    budget_period: str = "month"
    budgets: tuple[tuple[str, float], ...] = ()  # enforced ones only
    exempt_priority: int | None = 1000


def policy_teams(teams: dict[str, TeamSettings]) -> tuple[Team, ...]:
    """The policy's teams; a quota per GPU type is guaranteed per type (and its sum in total)."""
    return tuple(Team(name, t.weight, t.total_quota, t.limit_gpus, t.parent,
                      tuple(sorted(t.quota_gpus.items())) if isinstance(t.quota_gpus, dict) else ())
                 for name, t in sorted(teams.items()))


def fair_share_config(settings: Any) -> FairShareConfig | None:
    """The fair-share step's configuration from the settings; None (no step) when no team is named,
    no fair-share policy is chosen and no budget is enforced: the engine behaves as it always did."""
    budgets = settings.budgets
    if not settings.teams and settings.fair_share_policy is None and not budgets.enforce:
        return None
    return FairShareConfig(
        teams=policy_teams(settings.teams), policy=settings.fair_share_policy,
        half_life_s=settings.fair_share_half_life_seconds,
        capacity_gpus=settings.capacity_gpus or settings.max_gpus,
        budget_period=budgets.period,
        budgets=tuple(sorted(budgets.teams.items())) if budgets.enforce else (),
    )


def budget_refusal(settings: Any) -> dict[str, Any]:
    """What the intake needs to refuse a job at submission when its team's enforced budget is spent."""
    budgets = settings.budgets
    if not (budgets.enforce and budgets.over_budget == "refuse" and budgets.teams):
        return {}
    return {"refused_over": tuple(sorted(budgets.teams.items())), "budget_period": budgets.period}
