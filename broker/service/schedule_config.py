"""Settings models of the service's time-based policy changes (part of ``broker.config.settings.Settings``).

Kept import-light (pydantic only, APScheduler lazily) because ``broker.config.settings`` imports it.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from broker.spec.values import PRIORITY_CLASSES

if TYPE_CHECKING:
    from apscheduler.triggers.cron import CronTrigger

QUEUES: tuple[str, ...] = tuple(PRIORITY_CLASSES)


def policy_cron_trigger(expr: str, timezone: str = "UTC") -> CronTrigger:
    """A five-field crontab line (``minute hour day month day-of-week``) as an APScheduler trigger.

    Numeric weekdays are refused: APScheduler counts Monday as 0 where crontab counts Sunday as 0,
    so ``1`` would silently mean Tuesday. Names (``MON-FRI``) mean the same in both.
    """
    from apscheduler.triggers.cron import CronTrigger

    fields = expr.split()
    if len(fields) != 5:
        raise ValueError(f"expected five cron fields like '0 8 * * MON-FRI', got {expr!r}")
    if re.search(r"(?<!/)\d", fields[4]):
        raise ValueError(f"day of week {fields[4]!r}: use day names like MON-FRI, not numbers")
    try:
        return CronTrigger.from_crontab(expr, timezone=ZoneInfo(timezone))
    except ValueError as exc:
        raise ValueError(f"expected a cron expression like '0 8 * * MON-FRI', got {expr!r}: {exc}") from exc


class PolicySchedule(BaseModel):
    """At every fire of ``cron``, the queue priorities and capacity shares it names take effect.

    A queue is a priority class of the job file (``inference``, ``training``, ``batch``). Keys a
    schedule does not name keep the value the last schedule gave them.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(min_length=1, max_length=100, pattern=r"^[A-Za-z0-9_.-]+$")
    cron: str
    timezone: str = "UTC"
    queue_priority: dict[str, int] = Field(default_factory=dict, description="queue -> priority (higher first)")
    capacity_share: dict[str, float] = Field(
        default_factory=dict, description="queue -> fraction of capacity_gpus its running jobs may hold")

    @field_validator("timezone")
    @classmethod
    def _known_zone(cls, value: str) -> str:
        try:
            ZoneInfo(value)
        except (ZoneInfoNotFoundError, ValueError):
            raise ValueError(f"expected an IANA time zone like UTC or Europe/Paris, got {value!r}") from None
        return value

    @field_validator("queue_priority", "capacity_share")
    @classmethod
    def _known_queues(cls, value: dict[str, float]) -> dict[str, float]:
        for queue in value:
            if queue not in QUEUES:
                raise ValueError(f"unknown queue {queue!r}: expected one of {', '.join(QUEUES)}")
        return value

    @field_validator("queue_priority")
    @classmethod
    def _priorities(cls, value: dict[str, int]) -> dict[str, int]:
        for queue, priority in value.items():
            if priority < 0:
                raise ValueError(f"{queue}: expected a priority >= 0, got {priority}")
        return value

    @field_validator("capacity_share")
    @classmethod
    def _shares(cls, value: dict[str, float]) -> dict[str, float]:
        for queue, share in value.items():
            if not 0.0 <= share <= 1.0:
                raise ValueError(f"{queue}: expected a fraction between 0 and 1, got {share}")
        return value

    @model_validator(mode="after")
    def _valid_and_useful(self) -> PolicySchedule:
        policy_cron_trigger(self.cron, self.timezone)
        if not self.queue_priority and not self.capacity_share:
            raise ValueError(f"schedule {self.name!r} changes nothing: give queue_priority or capacity_share")
        return self

    def overrides(self) -> dict[str, float]:
        """The policy keys this schedule sets: ``queue_priority:<queue>`` and ``capacity_share:<queue>``."""
        keys: dict[str, float] = {f"queue_priority:{q}": float(p) for q, p in self.queue_priority.items()}
        keys.update({f"capacity_share:{q}": s for q, s in self.capacity_share.items()})
        return keys
