"""Entry point of the ``broker`` command. Importing a command module registers its commands."""

from __future__ import annotations

import logging
import sys

from broker.cli.app import UsageError, app, err_console


def _register() -> None:
    from broker.cli import dashboard, jobs, placement, prices, report, serve, simulate  # noqa: F401


def main(argv: list[str] | None = None) -> None:
    from broker.config import ConfigError
    from broker.engine import UnknownJob
    from broker.spec import SpecError
    from broker.store.db import StoreError
    from providers.trace import TraceError

    # Our own handler first: libraries that call logging.basicConfig(INFO) on import (SkyPilot's
    # catalog does) then leave the command's output alone.
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    _register()
    try:
        # Without standalone mode a command's typer.Exit(n) comes back as the return value.
        code = app(args=argv, standalone_mode=False)
    except (SpecError, ConfigError, TraceError, StoreError, UsageError, UnknownJob) as exc:
        err_console.print(f"[red]error:[/red] {exc}", highlight=False, markup=True, soft_wrap=True)
        sys.exit(2)
    except SystemExit:
        raise
    except KeyboardInterrupt:
        err_console.print("interrupted")
        sys.exit(130)
    except Exception as exc:
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
