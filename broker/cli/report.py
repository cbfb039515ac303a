"""``broker report``: what was spent and saved, as a table, JSON, CSV or HTML, by email or Slack."""

from __future__ import annotations

import sys
from typing import Annotated

import typer

from broker.cli.app import ConfigOption, UsageError, app


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
    from broker.config.settings import load_settings
    from broker.reports import deliver, render
    from broker.reports.build import build_report
    from broker.reports.settings import check_emails
    from broker.reports.window import ReportError, report_window
    from broker.store import open_store
    from broker.tokens import TEAM_PATTERN

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
    try:
        recipients = check_emails([a.strip() for a in email.split(",") if a.strip()]) if email else []
    except ValueError as exc:
        raise UsageError(f"--email: {exc}") from None
    if email is not None and not recipients:
        raise UsageError("--email: expected addresses like ops@example.com,lead@example.com")
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
            _print(built, output)
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


def _print(built: object, output: str) -> None:
    from broker.reports import render
    from broker.reports.model import Report

    assert isinstance(built, Report)
    if output == "table":
        from broker.cli.app import make_console

        render.print_table(built, make_console())
        return
    text = {"json": render.render_json, "csv": render.render_csv, "html": render.render_html}[output](built)
    sys.stdout.write(text if text.endswith("\n") else text + "\n")
