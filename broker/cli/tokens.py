"""``broker token create|list|revoke``: API tokens for teams, written straight to the store."""

from __future__ import annotations

import json
from typing import Annotated

import typer

from broker.cli.app import ConfigOption, JsonOption, UsageError, app

token_app = typer.Typer(help="API tokens for teams (the service's `Authorization: Bearer` tokens).",
                        no_args_is_help=True)
app.add_typer(token_app, name="token")


@token_app.command("create")
def create(team: Annotated[str, typer.Option("--team", help="the team the token acts for")],
           expires_in: Annotated[str | None, typer.Option(
               "--expires-in", help="refuse the token after this long, e.g. 12h or 30d (default: never)")] = None,
           config: ConfigOption = None) -> None:
    """Create a token for a team and print it once; only its hash is stored."""
    from broker.cli.app import err_console
    from broker.cli.prices import parse_duration
    from broker.config.settings import load_settings
    from broker.store import open_store
    from broker.tokens import create_api_token

    lifetime = parse_duration(expires_in, "--expires-in") if expires_in is not None else None
    settings = load_settings(config)
    store = open_store(settings.database_url)
    try:
        issued = create_api_token(store, team, lifetime)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    finally:
        store.dispose()
    err_console.print(f"token {issued.token_id} for team {issued.team} (shown once; store it now):")
    print(issued.token)


@token_app.command("list")
def list_tokens(config: ConfigOption = None, as_json: JsonOption = False) -> None:
    """Every token's id, team and dates (never the token itself)."""
    from rich.table import Table

    from broker.cli.app import console
    from broker.config.settings import load_settings
    from broker.store import open_store
    from broker.tokens import list_api_tokens

    settings = load_settings(config)
    store = open_store(settings.database_url)
    try:
        rows = list_api_tokens(store)
    finally:
        store.dispose()
    items = [{"token_id": r.id, "team": r.team, "created_at": r.created_at.isoformat(),
              "revoked_at": r.revoked_at.isoformat() if r.revoked_at else None,
              "expires_at": r.expires_at.isoformat() if r.expires_at else None} for r in rows]
    if as_json:
        print(json.dumps(items))
        return
    table = Table(header_style="bold")
    for column in ("token", "team", "created", "revoked", "expires"):
        table.add_column(column)
    for item in items:
        revoked, expires = item["revoked_at"] or "-", item["expires_at"] or "never"
        table.add_row(str(item["token_id"]), str(item["team"]), str(item["created_at"])[:19], revoked[:19],
                      expires[:19])
    console.print(table)


@token_app.command("revoke")
def revoke(token_id: Annotated[str, typer.Argument(help="the token's id, e.g. tok-1a2b3c4d")],
           config: ConfigOption = None) -> None:
    """Revoke a token: requests with it get 401 from then on."""
    from broker.cli.app import console
    from broker.config.settings import load_settings
    from broker.store import open_store
    from broker.tokens import revoke_api_token

    settings = load_settings(config)
    store = open_store(settings.database_url)
    try:
        found = revoke_api_token(store, token_id)
    finally:
        store.dispose()
    if not found:
        raise UsageError(f"no token {token_id!r}; `broker token list` shows them")
    console.print(f"{token_id}: revoked")
