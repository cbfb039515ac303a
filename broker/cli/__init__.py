"""Entry point of the ``broker`` command. A command's module is imported when that command runs."""

from __future__ import annotations

import logging
import sys

from broker.cli.app import LazyGroup, app, register_all
from broker.cli.commands import COMMANDS, HIDDEN
from broker.errors import is_user_error

LazyGroup.table, LazyGroup.hidden_names = COMMANDS, HIDDEN


def _register() -> None:
    register_all()


def main(argv: list[str] | None = None) -> None:
    # Our own handler first: libraries that call logging.basicConfig(INFO) on import (SkyPilot's
    # catalog does) then leave the command's output alone.
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    try:
        # Without standalone mode a command's typer.Exit(n) comes back as the return value.
        code = app(args=argv, standalone_mode=False, prog_name="broker")
    except SystemExit:
        raise
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        sys.exit(130)
    except Exception as exc:
        if is_user_error(exc):
            from broker.cli.app import err_console
            from broker.cli.job_output import shown

            err_console.print(f"[red]error:[/red] {shown(exc)}", highlight=False, markup=True, soft_wrap=True)
            sys.exit(2)
        # Usage errors from the command-line parser (Typer bundles its own copy of click).
        show, exit_code = getattr(exc, "show", None), getattr(exc, "exit_code", None)
        if callable(show) and isinstance(exit_code, int):
            show()
            sys.exit(exit_code)
        if type(exc).__name__ == "Abort":
            sys.exit(1)
        raise
    if isinstance(code, int) and code:
        sys.exit(code)
