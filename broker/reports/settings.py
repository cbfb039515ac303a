"""Settings models of the report schedules and team budgets (parts of ``broker.config.settings.Settings``)."""

from __future__ import annotations

import re
from datetime import UTC
from typing import TYPE_CHECKING, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

if TYPE_CHECKING:
    from apscheduler.triggers.cron import CronTrigger

_DOW_NAMES = ("sun", "mon", "tue", "wed", "thu", "fri", "sat", "sun")
_EMAIL = re.compile(r"^[^@\s,]+@[^@\s,]+$")


def cron_trigger(expr: str) -> CronTrigger:
    """A five-field crontab line as a trigger in UTC.

    APScheduler numbers weekdays from Monday=0, crontab from Sunday=0; numeric weekdays are
    translated to names so ``0 8 * * 1`` means Monday as it does in crontab.
    """
    from apscheduler.triggers.cron import CronTrigger

    fields = expr.split()
    if len(fields) != 5:
        raise ValueError(f"expected five cron fields like '0 8 * * MON', got {expr!r}")
    fields[4] = re.sub(r"(?<![/\d])\d+", lambda m: _DOW_NAMES[int(m.group())] if int(m.group()) <= 7 else m.group(),
                       fields[4])
    try:
        return CronTrigger.from_crontab(" ".join(fields), timezone=UTC)
    except ValueError as exc:
        raise ValueError(f"expected a cron expression like '0 8 * * MON', got {expr!r}: {exc}") from exc


def check_emails(addresses: list[str]) -> list[str]:
    for address in addresses:
        if not _EMAIL.match(address):
            raise ValueError(f"expected an email address like ops@example.com, got {address!r}")
    return addresses


def check_duration(value: str) -> str:
    from broker.spec.job import SpecError, parse_duration

    try:
        parse_duration(value)
    except SpecError as exc:
        raise ValueError(exc.detail) from exc
    return value


class ReportSchedule(BaseModel):
    """One scheduled report: ``{cron: "0 8 * * MON", email: [...], slack: true, team: nlp}``."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    cron: str
    name: str | None = Field(None, description="stable id of the schedule; default derived from its fields")
    window: str = Field("7d", description="the report covers this long before each run")
    team: str | None = None
    email: list[str] = Field(default_factory=list)
    slack: bool = False
    grace: str = Field("6h", description="a run missed by less than this (service down) is still sent")

    @field_validator("cron")
    @classmethod
    def _valid_cron(cls, value: str) -> str:
        cron_trigger(value)
        return value

    @field_validator("email")
    @classmethod
    def _valid_emails(cls, value: list[str]) -> list[str]:
        return check_emails(value)

    @field_validator("window", "grace")
    @classmethod
    def _valid_duration(cls, value: str) -> str:
        return check_duration(value)

    @model_validator(mode="after")
    def _has_a_target(self) -> ReportSchedule:
        if not self.email and not self.slack:
            raise ValueError("nothing to send to: give email addresses or slack: true")
        return self

    @property
    def key(self) -> str:
        if self.name:
            return self.name
        targets = ",".join(self.email) + (",slack" if self.slack else "")
        return f"{self.cron}|{self.team or '*'}|{self.window}|{targets}"[:200]


class BudgetSettings(BaseModel):
    """Spend limits per team and period; crossing a threshold sends one alert per period."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    period: Literal["day", "week", "month"] = "month"
    teams: dict[str, float] = Field(default_factory=dict, description="team -> budget in USD per period")
    thresholds: list[float] = Field(default_factory=lambda: [1.0], description="fractions of the budget")
    email: list[str] = Field(default_factory=list)
    slack: bool = False
    # Hold a team to its budget: a job whose predicted cost would take its team past it is not started
    # (running jobs are never stopped for money); over_budget: such a job waits, or is refused at submission.
    enforce: bool = False
    over_budget: Literal["wait", "refuse"] = "wait"

    @field_validator("email")
    @classmethod
    def _valid_emails(cls, value: list[str]) -> list[str]:
        return check_emails(value)

    @field_validator("teams")
    @classmethod
    def _positive_budgets(cls, teams: dict[str, float]) -> dict[str, float]:
        for team, budget in teams.items():
            if budget <= 0:
                raise ValueError(f"team {team!r}: expected a positive budget in USD, got {budget}")
        return teams

    @field_validator("thresholds")
    @classmethod
    def _positive_thresholds(cls, thresholds: list[float]) -> list[float]:
        if not thresholds or any(t <= 0 for t in thresholds):
            raise ValueError(f"expected positive fractions of the budget like [0.8, 1.0], got {thresholds}")
        return sorted(set(thresholds))
