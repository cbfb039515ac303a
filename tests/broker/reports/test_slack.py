from __future__ import annotations

import io
import json
from datetime import timedelta
from typing import Any

from PIL import Image

from broker.config.settings import Settings, load_settings
from broker.reports.build import Window, build_report
from broker.reports.deliver import deliver
from broker.reports.render import money
from broker.store import Store
from tests.broker.reports.conftest import SlackServer
from tests.broker.reports.ledger import DEMO_START, LedgerWriter

WINDOW = Window(DEMO_START, DEMO_START + timedelta(days=4))


def webhook_settings(server: SlackServer, **extra: Any) -> Settings:
    return load_settings(slack_webhook_url=server.webhook_url, delivery_backoff_s=0.05, **extra)


def bot_settings(server: SlackServer, **extra: Any) -> Settings:
    return load_settings(slack_token="xoxb-test-token", slack_channel="#gpu-costs", slack_api_url=f"{server.base}/api/",
                         delivery_backoff_s=0.05, **extra)


def block_text(blocks: list[dict[str, Any]]) -> str:
    parts = []
    for block in blocks:
        if "text" in block:
            parts.append(block["text"]["text"])
        parts += [f["text"] for f in block.get("fields", [])]
        parts += [e["text"] for e in block.get("elements", [])]
    return "\n".join(parts)


def test_webhook_blocks_carry_the_ledger_totals(sqlite_demo: tuple[Store, LedgerWriter],
                                                slack_server: SlackServer) -> None:
    store, writer = sqlite_demo
    [result] = deliver(store, webhook_settings(slack_server), build_report(store, WINDOW), email=[], slack=True)
    assert (result.channel, result.target, result.status, result.attempts) == ("slack", "webhook", "sent", 1)

    [(_, body, _)] = slack_server.calls("/hooks/T000/B000/XXXX")
    spend = sum(r["cost"] for r in writer.rows)
    on_demand = sum(r["on_demand_cost"] for r in writer.rows)
    text = block_text(body["blocks"])
    assert body["blocks"][0]["type"] == "header"
    assert f"*Spend*\n{money(spend)}" in text
    assert f"*On-demand equivalent*\n{money(on_demand)}" in text
    assert f"{money(on_demand - spend)} ({100 * (on_demand - spend) / on_demand:.1f}%)" in text
    assert "*Top jobs*\n• llama-finetune (nlp)" in text  # the biggest spender first
    assert "*Top wastes*\n1. Cluster c-az-1" in text
    assert money(spend) in body["text"]  # the notification fallback


def test_webhook_429_waits_for_retry_after(sqlite_demo: tuple[Store, LedgerWriter],
                                           slack_server: SlackServer) -> None:
    store, _ = sqlite_demo
    slack_server.script["/hooks/T000/B000/XXXX"] = [(429, {"Retry-After": "1"})]
    [result] = deliver(store, webhook_settings(slack_server), build_report(store, WINDOW), email=[], slack=True)
    assert result.status == "sent" and result.attempts == 2
    (first, _, _), (second, _, _) = slack_server.calls("/hooks/T000/B000/XXXX")
    assert second - first >= 1.0  # not the 0.05 s backoff: the server's Retry-After


def test_webhook_5xx_is_retried_with_backoff_then_recorded(sqlite_demo: tuple[Store, LedgerWriter],
                                                           slack_server: SlackServer) -> None:
    store, _ = sqlite_demo
    slack_server.script["/hooks/T000/B000/XXXX"] = [(500, {}), (503, {}), (500, {})]
    [result] = deliver(store, webhook_settings(slack_server, delivery_attempts=3), build_report(store, WINDOW),
                       email=[], slack=True)
    assert result.status == "failed" and result.attempts == 3 and "HTTP 500" in (result.error or "")
    times = [at for at, _, _ in slack_server.calls("/hooks/T000/B000/XXXX")]
    assert times[2] - times[1] >= 2 * 0.05 * 0.9 and times[1] - times[0] >= 0.05 * 0.9  # doubling backoff


def test_webhook_4xx_is_not_retried(sqlite_demo: tuple[Store, LedgerWriter], slack_server: SlackServer) -> None:
    store, _ = sqlite_demo
    slack_server.script["/hooks/T000/B000/XXXX"] = [(400, {})]
    [result] = deliver(store, webhook_settings(slack_server), build_report(store, WINDOW), email=[], slack=True)
    assert result.status == "failed" and result.attempts == 1
    assert len(slack_server.calls("/hooks/T000/B000/XXXX")) == 1


def test_bot_token_posts_blocks_and_uploads_the_chart(sqlite_demo: tuple[Store, LedgerWriter],
                                                      slack_server: SlackServer) -> None:
    store, writer = sqlite_demo
    [result] = deliver(store, bot_settings(slack_server), build_report(store, WINDOW), email=[], slack=True)
    assert (result.target, result.status) == ("#gpu-costs", "sent")

    [(_, post, _)] = slack_server.calls("/api/chat.postMessage")
    assert post["_auth"] == "Bearer xoxb-test-token"
    assert post["channel"] == "#gpu-costs"
    blocks = post["blocks"] if isinstance(post["blocks"], list) else json.loads(post["blocks"])
    assert f"*Spend*\n{money(sum(r['cost'] for r in writer.rows))}" in block_text(blocks)

    [(_, _upload, raw)] = slack_server.calls("/upload/F0CHART")
    image = Image.open(io.BytesIO(raw))
    assert image.format == "PNG"
    [(_, complete, _)] = slack_server.calls("/api/files.completeUploadExternal")
    assert complete["channel_id"] == "C0REPORTS"  # the id chat.postMessage answered with
    assert complete["thread_ts"] == "1700000000.000100"


def test_bot_token_429_is_honoured_without_posting_twice(sqlite_demo: tuple[Store, LedgerWriter],
                                                         slack_server: SlackServer) -> None:
    store, _ = sqlite_demo
    slack_server.script["/api/files.getUploadURLExternal"] = [(429, {"Retry-After": "1"})]
    [result] = deliver(store, bot_settings(slack_server), build_report(store, WINDOW), email=[], slack=True)
    assert result.status == "sent" and result.attempts == 2
    assert len(slack_server.calls("/api/chat.postMessage")) == 1
    (first, _, _), (second, _, _) = slack_server.calls("/api/files.getUploadURLExternal")
    assert second - first >= 1.0
