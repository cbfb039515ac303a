"""Reports in Slack: Block Kit through an incoming webhook, or a bot token that also uploads the chart."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from broker.reports.model import Report
from broker.reports.render import money, summary_lines
from broker.reports.retry import DeliveryError

if TYPE_CHECKING:
    from broker.config.settings import Settings

TOP_JOBS = 5


@dataclass(frozen=True, slots=True)
class SlackConfig:
    webhook_url: str | None = None
    token: str | None = None
    channel: str | None = None
    api_url: str = "https://slack.com/api/"
    timeout_s: float = 30.0

    def __repr__(self) -> str:  # the webhook URL and the token are both secrets
        return f"SlackConfig(channel={self.channel!r}, api_url={self.api_url!r})"

    @property
    def uses_bot(self) -> bool:
        return bool(self.token and self.channel)

    @property
    def target(self) -> str:
        return (self.channel or "") if self.uses_bot else "webhook"

    @classmethod
    def from_settings(cls, settings: Settings) -> SlackConfig:
        from broker.config.settings import ConfigError

        if settings.slack_token and not settings.slack_channel:
            raise ConfigError("BROKER_SLACK_TOKEN is set but BROKER_SLACK_CHANNEL is not: name the channel to post to")
        if not settings.slack_token and not settings.slack_webhook_url:
            raise ConfigError("Slack needs BROKER_SLACK_WEBHOOK_URL, or BROKER_SLACK_TOKEN and BROKER_SLACK_CHANNEL")
        return cls(
            webhook_url=settings.slack_webhook_url.get_secret_value() if settings.slack_webhook_url else None,
            token=settings.slack_token.get_secret_value() if settings.slack_token else None,
            channel=settings.slack_channel,
            api_url=settings.slack_api_url,
        )


# --- Block Kit ---

def _section(text: str) -> dict[str, Any]:
    return {"type": "section", "text": {"type": "mrkdwn", "text": text[:3000]}}


def report_blocks(report: Report) -> tuple[str, list[dict[str, Any]]]:
    """The fallback text and the blocks: totals, savings, top jobs, top wastes."""
    t = report.totals
    blocks: list[dict[str, Any]] = [
        {"type": "header", "text": {"type": "plain_text", "text": report.title[:150]}},
        {"type": "section", "fields": [
            {"type": "mrkdwn", "text": f"*Spend*\n{money(t.spend)}"},
            {"type": "mrkdwn", "text": f"*On-demand equivalent*\n{money(t.on_demand)}"},
            {"type": "mrkdwn", "text": f"*Saved*\n{money(t.saving)} ({t.saving_pct:.1f}%)"},
            {"type": "mrkdwn", "text": f"*GPU-hours*\n{t.gpu_hours:,.1f} ({t.idle_total_gpu_hours:,.1f} idle)"},
            {"type": "mrkdwn", "text": f"*Spot share*\n{100 * t.spot_share:.0f}%"},
            {"type": "mrkdwn", "text": f"*Preemptions*\n{t.preemptions} ({t.migrations} migrations, "
                                       f"{t.work_lost_s / 3600:,.1f} h work lost)"},
        ]},
    ]
    jobs = [g for g in report.groups.get("job", []) if g.key != "(idle)"][:TOP_JOBS]
    if jobs:
        lines = [f"• {g.label}: {money(g.figures.spend)}, saved {money(g.figures.saving)} "
                 f"({g.figures.saving_pct:.0f}%), {g.figures.preemptions} preemption(s)" for g in jobs]
        blocks.append(_section("*Top jobs*\n" + "\n".join(lines)))
    if report.wastes:
        lines = [f"{i}. {w.suggestion}" for i, w in enumerate(report.wastes, 1)]
        blocks.append(_section("*Top wastes*\n" + "\n".join(lines)))
    blocks.append({"type": "context", "elements": [
        {"type": "mrkdwn", "text": f"Generated {report.generated_at:%Y-%m-%d %H:%M} UTC from the cost ledger"}]})
    return " | ".join(summary_lines(report)[:1]) + f" ({report.title})", blocks


def alert_blocks(text: str, report: Report) -> tuple[str, list[dict[str, Any]]]:
    _, blocks = report_blocks(report)
    return text, [_section(f":rotating_light: *{text}*"), *blocks]


# --- sending (one attempt each; ``with_retries`` decides on another) ---

def post_webhook(config: SlackConfig, text: str, blocks: list[dict[str, Any]]) -> None:
    import httpx

    assert config.webhook_url
    try:
        response = httpx.post(config.webhook_url, json={"text": text, "blocks": blocks}, timeout=config.timeout_s)
    except httpx.HTTPError as exc:
        raise DeliveryError(f"Slack webhook: {type(exc).__name__}: {exc}") from exc
    _raise_for_status("Slack webhook", response.status_code, response.headers.get("Retry-After"), response.text)


def bot_sender(config: SlackConfig, text: str, blocks: list[dict[str, Any]],
               chart_png: bytes | None) -> Callable[[], None]:
    """A send step that posts the message, then uploads the chart; a retry resumes where it failed."""
    from slack_sdk import WebClient

    client = WebClient(token=config.token, base_url=config.api_url, timeout=int(config.timeout_s))
    state: dict[str, str] = {}

    def send() -> None:
        if "channel_id" not in state:
            response = _call(lambda: client.chat_postMessage(channel=config.channel or "", text=text, blocks=blocks))
            state["channel_id"] = str(response.get("channel") or config.channel)
            state["ts"] = str(response.get("ts") or "")
        if chart_png is not None and "uploaded" not in state:
            _call(lambda: client.files_upload_v2(
                channel=state["channel_id"], file=chart_png, filename="daily-spend.png",
                title="Daily spend vs on-demand equivalent", thread_ts=state["ts"] or None))
            state["uploaded"] = "yes"

    return send


def _call(request: Callable[[], Any]) -> Any:
    from slack_sdk.errors import SlackApiError, SlackRequestError

    try:
        return request()
    except SlackApiError as exc:
        response = exc.response
        error = response.get("error") if isinstance(response.data, dict) else response.data
        _raise_for_status("Slack API", response.status_code, response.headers.get("Retry-After")
                          or response.headers.get("retry-after"), str(error))
        raise DeliveryError(f"Slack API: {error}", transient=False) from exc
    except SlackRequestError as exc:
        raise DeliveryError(f"Slack API: {exc}") from exc
    except OSError as exc:
        raise DeliveryError(f"Slack API: {type(exc).__name__}: {exc}") from exc


def _raise_for_status(what: str, status: int, retry_after: str | None, body: str) -> None:
    if status == 200:
        return
    if status == 429:
        try:
            wait = float(retry_after) if retry_after is not None else None
        except ValueError:
            wait = None
        raise DeliveryError(f"{what}: 429 rate limited (Retry-After {retry_after})", retry_after=wait)
    raise DeliveryError(f"{what}: HTTP {status}: {body[:200]}", transient=status >= 500)
