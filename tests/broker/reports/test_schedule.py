from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import func, select

from broker.config.settings import ConfigError, load_settings
from broker.reports.schedule import check_budgets, due_fire_time, run_due_reports
from broker.reports.settings import ReportSchedule
from broker.store import Store
from broker.store.deliveries import BudgetAlertRow, ReportDeliveryRow
from tests.broker.reports.conftest import SlackServer
from tests.broker.reports.ledger import DEMO_START, LedgerWriter

HOOK = "/hooks/T000/B000/XXXX"


def test_cron_weekdays_count_from_sunday_as_in_crontab() -> None:
    schedule = ReportSchedule(cron="0 8 * * 1", slack=True)  # Monday
    monday_8 = datetime(2026, 3, 9, 8, 0, tzinfo=UTC)
    assert due_fire_time(schedule, monday_8 + timedelta(minutes=5)) == monday_8
    assert due_fire_time(schedule, monday_8 - timedelta(minutes=1)) is None
    assert due_fire_time(schedule, monday_8 + timedelta(hours=7)) is None  # past the 6 h grace
    named = ReportSchedule(cron="0 8 * * MON", slack=True)
    assert due_fire_time(named, monday_8 + timedelta(minutes=5)) == monday_8


def test_scheduled_report_is_sent_once_per_fire_time(sqlite_demo: tuple[Store, LedgerWriter],
                                                     slack_server: SlackServer) -> None:
    store, writer = sqlite_demo
    settings = load_settings(slack_webhook_url=slack_server.webhook_url,
                             reports=[{"cron": "0 8 * * MON", "slack": True, "team": "vision", "window": "7d"}])
    monday_8 = datetime(2026, 3, 9, 8, 0, tzinfo=UTC)  # the week after the demo ledger
    assert run_due_reports(store, settings, monday_8 - timedelta(minutes=1)) == []
    first = run_due_reports(store, settings, monday_8 + timedelta(seconds=30))
    for minute in range(1, 5):  # the service keeps polling
        assert run_due_reports(store, settings, monday_8 + timedelta(minutes=minute)) == []
    assert [r.status for r in first] == ["sent"]
    [(_, body, _)] = slack_server.calls(HOOK)
    vision_spend = sum(r["cost"] for r in writer.rows
                       if r["cluster_id"] in {"c-az-1", "c-az-2"} and r["minute"] >= monday_8 - timedelta(days=7))
    assert f"${vision_spend:,.2f}" in str(body["blocks"])
    assert "team vision" in body["blocks"][0]["text"]["text"]
    with store.transaction() as s:
        row = s.get(ReportDeliveryRow, first[0].id)
        assert row is not None and row.schedule == settings.reports[0].key
        assert row.payload["report"]["start"] == (monday_8 - timedelta(days=7)).isoformat()
    # Next week's fire time is a new report.
    assert len(run_due_reports(store, settings, monday_8 + timedelta(days=7, minutes=1))) == 1


def test_budget_alert_is_sent_once_not_once_per_poll(sqlite_demo: tuple[Store, LedgerWriter],
                                                     slack_server: SlackServer) -> None:
    store, writer = sqlite_demo
    nlp_spend = sum(r["cost"] for r in writer.rows if r["cluster_id"] in {"c-aws-1", "c-gcp-1", "c-aws-2"})
    budget = nlp_spend / 2  # crossed within the demo's first day
    settings = load_settings(slack_webhook_url=slack_server.webhook_url,
                             budgets={"period": "month", "teams": {"nlp": budget, "vision": 1e6},
                                      "thresholds": [0.8, 1.0], "slack": True})
    polls = [DEMO_START + timedelta(hours=h) for h in range(0, 80, 4)]
    sent = [r for now in polls for r in check_budgets(store, settings, now)]
    assert [r.status for r in sent] == ["sent", "sent"]  # 80 % first, then 100 %: each once
    texts = [body["blocks"][0]["text"]["text"] for _, body, _ in slack_server.calls(HOOK)]
    assert "team nlp" in texts[0] and "of its $" in texts[0]
    assert all("vision" not in t for t in texts)
    with store.transaction() as s:
        assert s.scalar(select(func.count()).select_from(BudgetAlertRow)) == 2
        assert s.scalar(select(func.count()).select_from(ReportDeliveryRow)) == 2
    # A new month starts over.
    assert len(check_budgets(store, settings, datetime(2026, 4, 1, 1, tzinfo=UTC))) == 0  # no April spend


def test_a_jump_past_several_thresholds_alerts_once(sqlite_demo: tuple[Store, LedgerWriter],
                                                    slack_server: SlackServer) -> None:
    store, _ = sqlite_demo
    settings = load_settings(slack_webhook_url=slack_server.webhook_url,
                             budgets={"teams": {"vision": 10.0}, "thresholds": [0.5, 0.8, 1.0], "slack": True})
    late = DEMO_START + timedelta(days=3)
    assert len(check_budgets(store, settings, late)) == 1
    assert check_budgets(store, settings, late + timedelta(hours=1)) == []
    assert "vision" in slack_server.calls(HOOK)[0][1]["blocks"][0]["text"]["text"]


@pytest.mark.parametrize(("reports", "message"), [
    ([{"cron": "0 8 * *", "slack": True}], "reports.0.cron"),
    ([{"cron": "0 8 * * MON"}], "nothing to send to"),
    ([{"cron": "0 8 * * MON", "email": ["nobody"]}], "reports.0.email"),
    ([{"cron": "0 8 * * MON", "slack": True, "window": "a week"}], "reports.0.window"),
])
def test_bad_schedules_name_the_field(reports: list[dict[str, object]], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        load_settings(reports=reports)


def test_secrets_never_print() -> None:
    settings = load_settings(smtp_password="hunter2", slack_token="xoxb-secret", slack_webhook_url="https://h/s")
    shown = repr(settings) + str(settings.model_dump())
    assert "hunter2" not in shown and "xoxb-secret" not in shown and "https://h/s" not in shown


def test_replicas_polling_at_once_send_a_scheduled_report_once(demo: tuple[Store, LedgerWriter],
                                                               slack_server: SlackServer) -> None:
    import threading

    from broker.store import open_store

    store, _ = demo
    settings = load_settings(slack_webhook_url=slack_server.webhook_url,
                             reports=[{"cron": "0 8 * * MON", "slack": True}])
    now = datetime(2026, 3, 9, 8, 1, tzinfo=UTC)
    replicas = [open_store(store.url) for _ in range(4)]
    barrier = threading.Barrier(len(replicas))
    sent: list[int] = []

    def poll(replica: Store) -> None:
        barrier.wait()
        sent.extend(r.id for r in run_due_reports(replica, settings, now))

    threads = [threading.Thread(target=poll, args=(r,)) for r in replicas]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for replica in replicas:
        replica.dispose()
    assert len(sent) == 1 and len(slack_server.calls(HOOK)) == 1
