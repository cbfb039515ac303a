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


GLOBAL_FLAGS = ("--no-color",)  # accepted before the command (`broker --no-color status`) and after it


def hoist_global_flags(argv: list[str]) -> list[str]:
    """``broker status --no-color`` as ``broker --no-color status``: a global flag anywhere before ``--``
    moves to the front, so the same words work in every place."""
    end = argv.index("--") if "--" in argv else len(argv)
    found = [a for a in argv[:end] if a in GLOBAL_FLAGS]
    if not found:
        return argv
    return list(dict.fromkeys(found)) + [a for a in argv[:end] if a not in GLOBAL_FLAGS] + argv[end:]


def _reader_went_away() -> None:
    """The reader of a pipe closed it (`broker report | head -1`): what it wanted it got, so exit 0.

    Whatever Python would still flush into the closed pipe at exit goes to /dev/null instead.
    """
    import os

    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):
        pass
    raise SystemExit(0)


def _stdout_closed() -> bool:
    """Whether stdout is a pipe whose reader has gone (poll reports an error on its write end)."""
    import select

    try:
        poller = select.poll()
        poller.register(sys.stdout.fileno(), select.POLLOUT)
        return any(events & (select.POLLERR | select.POLLHUP) for _, events in poller.poll(0))
    except (OSError, ValueError, AttributeError):
        return False


def _pipe_closed(exc: BaseException) -> bool:
    """Whether an exit 1 is a library's answer to EPIPE: click's main wraps stdout in ``PacifyFlushWrapper``;
    a Rich console of a command's own raises SystemExit(1) while handling the BrokenPipeError."""
    if type(sys.stdout).__name__ == "PacifyFlushWrapper":
        return True
    cause: BaseException | None = exc.__context__
    for _ in range(8):  # a short chain; never a cycle
        if cause is None:
            return False
        if isinstance(cause, BrokenPipeError):
            return True
        cause = cause.__context__
    return False


def main(argv: list[str] | None = None) -> None:
    # Our own handler first: libraries that call logging.basicConfig(INFO) on import (SkyPilot's
    # catalog does) then leave the command's output alone.
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    args = hoist_global_flags(list(sys.argv[1:] if argv is None else argv))
    try:
        # Without standalone mode a command's typer.Exit(n) comes back as the return value.
        code = app(args=args, standalone_mode=False, prog_name="broker")
        sys.stdout.flush()
    except BrokenPipeError:
        if not _stdout_closed():  # a socket's broken pipe (a server gone) is an error, not a reader gone
            raise
        _reader_went_away()
    except SystemExit as exc:
        if exc.code == 1 and _pipe_closed(exc):
            _reader_went_away()
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
