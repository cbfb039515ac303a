"""``broker report``: what was spent and saved, as a table, JSON, CSV or HTML, by email or Slack."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Annotated

import typer

from broker.cli.app import ConfigOption, UsageError, app

if TYPE_CHECKING:
    from rich.console import Console

    from broker.config.settings import Settings
    from broker.reports.shares import TeamShare
    from broker.reports.window import Window
    from broker.store import Store


@app.command()
def report(
    since: Annotated[str | None, typer.Option("--since", help="window back from --to (default now): 7d, 24h")] = None,
    start: Annotated[str | None, typer.Option("--from", help="window start (UTC): 2026-03-02T08:00")] = None,
    end: Annotated[str | None, typer.Option("--to", help="window end, UTC (default now)")] = None,
    team: Annotated[str | None, typer.Option("--team", help="only this team's spend")] = None,
    output: Annotated[str, typer.Option("--format", help="table, json, csv or html")] = "table",
    as_json: Annotated[bool, typer.Option("--json", help="the same as --format json")] = False,
    email: Annotated[str | None, typer.Option("--email", help="send to these addresses: a@x.com,b@y.com")] = None,
    slack: Annotated[bool, typer.Option("--slack", help="post to Slack")] = False,
    resend: Annotated[str | None, typer.Option("--resend", help="send a recorded delivery again, by its id")] = None,
    config: ConfigOption = None,
) -> None:
    """Spend, on-demand equivalent, savings, preemptions and idle GPU-hours by job, team, cloud, region, GPU."""
    from datetime import UTC, datetime

    from broker.reports.window import ReportError, parse_window

    if resend is None:  # the window's words first, before any heavy import; the store's clock places it later
        try:  # (against a late "now": a replay's ledger may run ahead of the wall clock)
            parse_window(since, start, end, datetime(3000, 1, 1, tzinfo=UTC))
        except ReportError as exc:
            raise UsageError(str(exc)) from None
    from broker.model import TEAM_PATTERN
    from broker.reports import render

    if as_json:
        if output not in ("table", "json"):
            raise UsageError(f"--json and --format {output[:40]}: choose one")
        output = "json"
    if team is not None and not TEAM_PATTERN.match(team):
        raise UsageError(f"--team: expected letters, digits, '.', '_' or '-' (1-100 characters), got {team[:40]!r}")
    if resend is not None and not (resend.isascii() and resend.isdigit() and len(resend) <= 18):
        raise UsageError(f"--resend: expected a delivery id (a number), got {resend!r}")
    if output not in render.FORMATS:
        raise UsageError(f"--format: expected one of {', '.join(render.FORMATS)}, got {output!r}")
    if resend is not None and (since or start or end or team or email or slack):
        raise UsageError("--resend takes no other report options: it sends the recorded report as it was built")
    from broker.reports.settings import check_emails

    try:
        recipients = check_emails([a.strip() for a in email.split(",") if a.strip()]) if email else []
    except ValueError as exc:
        raise UsageError(f"--email: {exc}") from None
    if email is not None and not recipients:
        raise UsageError("--email: expected addresses like ops@example.com,lead@example.com")
    from broker.config.settings import load_settings
    from broker.reports import deliver
    from broker.reports.build import build_report
    from broker.reports.window import report_window
    from broker.store import open_store

    settings = load_settings(config)
    store = open_store(settings.database_url)
    try:
        window = report_window(store, since, start, end) if resend is None else None
    except ReportError as exc:
        store.dispose()
        raise UsageError(str(exc)) from None
    try:
        deliver.check_channels(settings, recipients, slack)
        if resend is not None:
            try:
                results = [deliver.send(store, settings, int(resend))]
            except deliver.UnknownDelivery as exc:
                raise UsageError(str(exc)) from None
        else:
            assert window is not None
            built = build_report(store, window, team=team)
            _print(built, output, _shares(store, settings, window, team) if output in ("table", "json") else None)
            results = deliver.deliver(store, settings, built, email=recipients, slack=slack) \
                if recipients or slack else []
    finally:
        store.dispose()
    from broker.cli.app import err_console

    failed = False
    for result in results:
        where = f"{result.channel} to {result.target}"
        if result.status == "sent":
            err_console.print(f"sent {where} (delivery {result.id})", highlight=False)
        else:
            failed = True
            err_console.print(f"[red]failed[/red] {where} (delivery {result.id}, {result.attempts} attempt(s)): "
                              f"{result.error}\n  the report is kept: resend it with `broker report --resend "
                              f"{result.id}`", highlight=False, markup=True)
    if failed:
        # Not typer.Exit: with standalone_mode=False click returns its code and main() drops it.
        sys.exit(1)


def _shares(store: Store, settings: Settings, window: Window, team: str | None) -> list[TeamShare] | None:
    """The section per team under fair share, when teams are named (``broker.reports.shares``)."""
    from broker.config.teams import fair_share_config

    config = fair_share_config(settings)
    if config is None or not config.teams:
        return None
    from broker.reports.shares import team_shares

    budgets = tuple(sorted(settings.budgets.teams.items()))
    lines = team_shares(store, window, config, budgets, settings.budgets.period)
    return [line for line in lines if team is None or line.team == team]


def _print(built: object, output: str, shares: list[TeamShare] | None = None) -> None:
    from broker.reports import render
    from broker.reports.model import Report

    assert isinstance(built, Report)
    if output == "table":
        from broker.cli.app import make_console

        console = make_console()
        render.print_table(built, console)
        if shares is not None:
            _print_shares(shares, console)
        return
    if output == "json" and shares is not None:
        import json

        sys.stdout.write(json.dumps({**built.to_dict(), "fair_share": [s.as_dict() for s in shares]}, indent=2)
                         + "\n")
        return
    text = {"json": render.render_json, "csv": render.render_csv, "html": render.render_html}[output](built)
    sys.stdout.write(text if text.endswith("\n") else text + "\n")


def _print_shares(shares: list[TeamShare], console: Console) -> None:
    from rich.table import Table

    from broker.cli.job_output import shown

    table = Table(title="Fair share by team", header_style="bold")
    for column in ("team", "GPU-hours", "share received", "share owed", "reclaims given", "taken",
                   "work lost to reclaims h", "budget spent last by"):
        table.add_column(column)
    for line in shares:
        table.add_row(shown(line.team), f"{line.gpu_hours:.2f}", f"{line.share_received:.1%}",
                      f"{line.share_owed:.1%}", str(line.reclaims_given), str(line.reclaims_taken),
                      f"{line.work_lost_hours:.2f}", shown(", ".join(line.budget_spent_by) or "-"))
    console.print(table)
