"""Deliveries: record the built report first, then send it; a failed send stays resendable by its id."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from broker.config.settings import ConfigError, Settings
from broker.errors import UserError
from broker.reports import charts, render
from broker.reports.email import SmtpConfig, build_message, new_cid, send_message
from broker.reports.model import Report
from broker.reports.retry import Outcome, RetryPolicy, with_retries
from broker.reports.slack import SlackConfig, alert_blocks, bot_sender, post_webhook, report_blocks
from broker.store import Store
from broker.store.deliveries import ReportDeliveryRow

EMAIL, SLACK = "email", "slack"


class UnknownDelivery(UserError, LookupError):
    pass


@dataclass(frozen=True, slots=True)
class DeliveryResult:
    id: int
    channel: str
    target: str
    status: str  # sent | failed
    attempts: int  # in total, over every send of this delivery
    error: str | None = None


def check_channels(settings: Settings, email: list[str], slack: bool) -> None:
    """Fail on missing SMTP/Slack settings before anything is recorded."""
    if email:
        SmtpConfig.from_settings(settings)
    if slack:
        SlackConfig.from_settings(settings)


def deliver(store: Store, settings: Settings, report: Report, *, email: list[str], slack: bool,
            alert: str | None = None, schedule: str | None = None, now: datetime | None = None,
            sleep: Callable[[float], None] = time.sleep) -> list[DeliveryResult]:
    """Record one delivery per channel, then send each; ``alert`` makes it a budget alert."""
    payload: dict[str, Any] = {"report": report.to_dict()}
    if alert:
        payload["alert"] = alert
    targets: list[tuple[str, str]] = []
    if email:
        targets.append((EMAIL, ",".join(email)))
    if slack:
        try:
            targets.append((SLACK, SlackConfig.from_settings(settings).target))
        except ConfigError:
            targets.append((SLACK, "unconfigured"))  # recorded as failed below, resendable once configured
    ids = [record(store, kind="budget_alert" if alert else "report", channel=channel, target=target,
                  payload=payload, schedule=schedule, now=now) for channel, target in targets]
    return [send(store, settings, delivery_id, sleep=sleep) for delivery_id in ids]


def record(store: Store, *, kind: str, channel: str, target: str, payload: dict[str, Any],
           schedule: str | None = None, now: datetime | None = None) -> int:
    with store.transaction() as s:
        row = ReportDeliveryRow(kind=kind, channel=channel, target=target, payload=payload, status="pending",
                                attempts=0, schedule=schedule, created_at=now or datetime.now(UTC))
        s.add(row)
        s.flush()
        return row.id


def send(store: Store, settings: Settings, delivery_id: int,
         sleep: Callable[[float], None] = time.sleep) -> DeliveryResult:
    """Send (or resend) a recorded delivery with retries, and record how it went."""
    with store.transaction() as s:
        row = s.get(ReportDeliveryRow, delivery_id)
        if row is None:
            raise UnknownDelivery(f"no report delivery with id {delivery_id}")
        channel, target, payload = row.channel, row.target, dict(row.payload)
    report = Report.from_dict(payload["report"])
    alert = payload.get("alert")
    policy = RetryPolicy(settings.delivery_attempts, settings.delivery_backoff_s, settings.delivery_max_wait_s)
    try:
        if channel == EMAIL:
            step = _email_step(settings, report, alert, target)
        else:
            step = _slack_step(settings, report, alert)
        outcome = with_retries(step, policy, sleep)
    except ConfigError as exc:
        outcome = Outcome(False, 0, str(exc))
    now = datetime.now(UTC)
    with store.transaction() as s:
        row = s.get(ReportDeliveryRow, delivery_id)
        assert row is not None
        row.attempts += outcome.attempts
        row.last_attempt_at = now
        row.status = "sent" if outcome.ok else "failed"
        row.last_error = outcome.error
        if outcome.ok:
            row.sent_at = now
        return DeliveryResult(row.id, channel, target, row.status, row.attempts, row.last_error)


def subject(report: Report, alert: str | None) -> str:
    if alert:
        return f"[GPU budget] {alert}"
    t = report.totals
    scope = f" ({report.team})" if report.team else ""
    return (f"GPU spend{scope} {report.start:%b %d}–{report.end:%b %d}: {render.money(t.spend)}, "
            f"saved {render.money(t.saving)} ({t.saving_pct:.0f}%) vs on-demand")


def _email_step(settings: Settings, report: Report, alert: str | None, target: str) -> Callable[[], None]:
    config = SmtpConfig.from_settings(settings)
    cid = new_cid()
    text = render.render_text(report)
    html = render.render_html(report, chart_cid=cid)
    if alert:
        text = f"{alert}\n\n{text}"
        html = f"<p style='font-size:16px;color:#b00020'><b>{_escape(alert)}</b></p>\n{html}"
    message = build_message(subject=subject(report, alert), sender=config.sender, recipients=target.split(","),
                            text=text, html=html, chart_png=charts.daily_spend_png(report), chart_cid=cid)
    return lambda: send_message(message, config)


def _slack_step(settings: Settings, report: Report, alert: str | None) -> Callable[[], None]:
    config = SlackConfig.from_settings(settings)
    text, blocks = alert_blocks(alert, report) if alert else report_blocks(report)
    if config.uses_bot:
        return bot_sender(config, text, blocks, charts.daily_spend_png(report))
    return lambda: post_webhook(config, text, blocks)


def _escape(text: str) -> str:
    from html import escape

    return escape(text)
