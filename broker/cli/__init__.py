"""Entry point of the ``broker`` command. Importing a command module registers its commands."""

from __future__ import annotations

import sys

from broker.cli.app import UsageError, app, err_console


def _register() -> None:
    import broker.cli.simulate  # noqa: F401
    from broker.cli import jobs  # noqa: F401


def main(argv: list[str] | None = None) -> None:
    from broker.config import ConfigError
    from broker.spec import SpecError
    from broker.store.db import StoreError
    from providers.trace import TraceError

    _register()
    try:
        app(args=argv, standalone_mode=False)
    except (SpecError, ConfigError, TraceError, StoreError, UsageError) as exc:
        err_console.print(f"[red]error:[/red] {exc}", highlight=False, markup=True, soft_wrap=True)
        sys.exit(2)
    except SystemExit:
        raise
    except KeyboardInterrupt:
        err_console.print("interrupted")
        sys.exit(130)
    except Exception as exc:  # click's own usage errors come through here
        import click

        if isinstance(exc, click.exceptions.ClickException):
            exc.show()
            sys.exit(exc.exit_code)
        if isinstance(exc, click.exceptions.Abort):
            sys.exit(1)
        raise
