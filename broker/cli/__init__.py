"""Entry point of the ``broker`` command. A command's module is imported when that command runs."""

from __future__ import annotations

import logging
import sys

from broker.cli.app import UsageError, app, register_all

# The errors a command raises for bad input, as (module, class): printed as one line, exit 2. They
# are looked up in sys.modules, so catching them imports nothing: an error whose module was never
# imported cannot have been raised.
USER_ERRORS = (
    ("broker.config.file", "ConfigError"),
    ("broker.engine.machine", "UnknownJob"),
    ("broker.spec.job", "SpecError"),
    ("broker.store.db", "StoreError"),
    ("providers.trace", "TraceError"),
)


def _register() -> None:
    register_all()


def _is_user_error(exc: BaseException) -> bool:
    if isinstance(exc, UsageError):
        return True
    for module_name, class_name in USER_ERRORS:
        module = sys.modules.get(module_name)
        error = getattr(module, class_name, None) if module is not None else None
        if isinstance(error, type) and isinstance(exc, error):
            return True
    return False


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
        if _is_user_error(exc):
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
