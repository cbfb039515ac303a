"""What the service calls on its scheduler: send the reports that are due, and alert on budgets once.

Both are idempotent under repeated polls and several replicas: a fire time or a (team, period,
threshold) is claimed by inserting a row under a unique key, and only the claimer sends.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import datetime, timedelta

from sqlalchemy.exc import IntegrityError

from broker.config.settings import Settings
from broker.reports.build import Window, build_report, period_start
from broker.reports.deliver import DeliveryResult, deliver
from broker.reports.render import money
from broker.reports.settings import ReportSchedule, cron_trigger
from broker.spec.job import parse_duration
from broker.store import Store
from broker.store.deliveries import BudgetAlertRow, ReportRunRow


def due_fire_time(schedule: ReportSchedule, now: datetime) -> datetime | None:
    """The latest fire time of the schedule in ``(now - grace, now]``, if any."""
    trigger = cron_trigger(schedule.cron)
    since = now - parse_duration(schedule.grace, "grace")
    latest = None
    fire = trigger.get_next_fire_time(None, since + timedelta(microseconds=1))
    while fire is not None and fire <= now:
        latest = fire
        fire = trigger.get_next_fire_time(fire, fire + timedelta(seconds=1))
    return latest


def run_due_reports(store: Store, settings: Settings, now: datetime,
                    sleep: Callable[[float], None] = time.sleep) -> list[DeliveryResult]:
    """Build and send every scheduled report whose fire time has come and was not sent yet."""
    results: list[DeliveryResult] = []
    for schedule in settings.reports:
        fire = due_fire_time(schedule, now)
        if fire is None or not _claim(store, ReportRunRow(schedule=schedule.key, fire_time=fire, claimed_at=now)):
            continue
        window = Window(fire - parse_duration(schedule.window, "window"), fire)
        report = build_report(store, window, team=schedule.team, now=now)
        results += deliver(store, settings, report, email=list(schedule.email), slack=schedule.slack,
                           schedule=schedule.key, now=now, sleep=sleep)
    return results


def check_budgets(store: Store, settings: Settings, now: datetime,
                  sleep: Callable[[float], None] = time.sleep) -> list[DeliveryResult]:
    """Alert once per team, period and threshold when a team's spend in the period crosses its budget."""
    budgets = settings.budgets
    if not budgets.teams or not (budgets.email or budgets.slack):
        return []
    start = period_start(now, budgets.period)
    results: list[DeliveryResult] = []
    for team, budget in sorted(budgets.teams.items()):
        report = build_report(store, Window(start, now), team=team, now=now)
        spend = report.totals.spend
        crossed = [t for t in budgets.thresholds if spend >= t * budget]
        if not crossed:
            continue
        threshold = max(crossed)  # one alert for the highest line crossed, even if several were at once
        claims = [BudgetAlertRow(team=team, period_start=start, threshold=t, spend=spend, budget=budget,
                                 created_at=now) for t in [threshold, *crossed[:-1]]]
        # Lower thresholds crossed in the same jump are claimed too, so they never alert later.
        if not _claim(store, claims[0], tuple(claims[1:])):
            continue
        alert = (f"team {team} spent {money(spend)} of its {money(budget)} {budgets.period}ly budget "
                 f"({100 * spend / budget:.0f}%) since {start:%Y-%m-%d}")
        results += deliver(store, settings, report, email=list(budgets.email), slack=budgets.slack, alert=alert,
                           now=now, sleep=sleep)
    return results


def _claim(store: Store, row: ReportRunRow | BudgetAlertRow, optional: tuple[BudgetAlertRow, ...] = ()) -> bool:
    """Insert the claim row (and any ``optional`` ones not yet there); False when another poll holds it."""
    try:
        with store.transaction() as s:
            s.add(row)
            s.flush()
            for extra in optional:
                try:
                    with s.begin_nested():
                        s.add(extra)
                except IntegrityError:
                    pass
    except IntegrityError:
        return False
    return True
