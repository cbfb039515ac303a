"""Tables of the cost reports (``broker/reports``): each send of a report, each scheduled run claimed,
each budget alert. Changing one means adding an Alembic migration."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import JSON, Float, Integer, String, Text, UniqueConstraint
from sqlalchemy.orm import Mapped, mapped_column

from broker.store.base import Base, UtcDateTime


class ReportDeliveryRow(Base):
    """One send of a built report (or budget alert) to one channel; the payload survives a failed send."""

    __tablename__ = "report_deliveries"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    kind: Mapped[str] = mapped_column(String(20))  # report | budget_alert
    channel: Mapped[str] = mapped_column(String(20))  # email | slack
    target: Mapped[str] = mapped_column(Text)  # comma-separated addresses, a Slack channel, or "webhook"
    payload: Mapped[dict[str, Any]] = mapped_column(JSON)  # the built report, enough to render it again
    status: Mapped[str] = mapped_column(String(20), index=True)  # pending | sent | failed
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    last_error: Mapped[str | None] = mapped_column(Text, nullable=True)
    schedule: Mapped[str | None] = mapped_column(String(200), nullable=True)
    created_at: Mapped[datetime] = mapped_column(UtcDateTime)
    last_attempt_at: Mapped[datetime | None] = mapped_column(UtcDateTime, nullable=True)
    sent_at: Mapped[datetime | None] = mapped_column(UtcDateTime, nullable=True)


class ReportRunRow(Base):
    """A scheduled report's fire time, claimed once so replicas and restarts never send it twice."""

    __tablename__ = "report_runs"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    schedule: Mapped[str] = mapped_column(String(200))
    fire_time: Mapped[datetime] = mapped_column(UtcDateTime)
    claimed_at: Mapped[datetime] = mapped_column(UtcDateTime)

    __table_args__ = (UniqueConstraint("schedule", "fire_time", name="uq_report_run"),)


class BudgetAlertRow(Base):
    """A team crossing a budget threshold in one period: the row makes the alert go out once."""

    __tablename__ = "budget_alerts"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    team: Mapped[str] = mapped_column(String(100))
    period_start: Mapped[datetime] = mapped_column(UtcDateTime)
    threshold: Mapped[float] = mapped_column(Float)
    spend: Mapped[float] = mapped_column(Float)
    budget: Mapped[float] = mapped_column(Float)
    created_at: Mapped[datetime] = mapped_column(UtcDateTime)

    __table_args__ = (UniqueConstraint("team", "period_start", "threshold", name="uq_budget_alert"),)
