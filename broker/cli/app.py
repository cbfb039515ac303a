"""The ``broker`` command: one Typer app; each group of commands lives in its own module."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

app = typer.Typer(
    name="broker",
    help="Run GPU training on the cheapest spot capacity across AWS, GCP and Azure without losing work.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

console = Console()
err_console = Console(stderr=True)

ConfigOption = Annotated[Path | None, typer.Option("--config", help="settings file (default ~/.broker/config.yaml)")]
JsonOption = Annotated[bool, typer.Option("--json", help="print one JSON object instead of a table")]


class UsageError(Exception):
    """A user error to print as one line and exit 2 (bad input, unknown job, missing file)."""


@app.callback()
def _root() -> None:
    """Run GPU training on the cheapest spot capacity across AWS, GCP and Azure without losing work."""
    # A Typer app with one command collapses into that command; the callback keeps `broker <command>`.
