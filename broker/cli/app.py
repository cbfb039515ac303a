"""The ``broker`` command: one Typer app; each group of commands lives in its own module.

Start-up is kept to Typer itself: the root group knows every command's name and one-line help
from ``broker.cli.commands`` and imports a command's module only when that command runs (or shows its own
``--help``). Rich is imported when a command first prints through ``console``/``err_console``.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, ClassVar

import typer
from typer import _click
from typer._coercion import RuntimeParam
from typer.core import TyperCommand, TyperGroup, _TyperParameter

from broker.errors import UserError

if TYPE_CHECKING:
    from rich.console import Console

PIPE_WIDTH = 10_000  # columns when stdout is not a terminal: tables are printed whole, never cut


_TRUE, _FALSE = {"1", "true", "t", "yes", "y", "on"}, {"0", "false", "f", "no", "n", "off", ""}


class _PlainParam(RuntimeParam):
    """Coerce a str, int, float, bool or Path option without Pydantic.

    Typer checks every value with a Pydantic TypeAdapter, and importing Pydantic costs a few hundred
    milliseconds: more than `broker status --server` may take in all. Our options are plain types.
    """

    def _coerce_value(self, value: Any, param: _TyperParameter, ctx: _click.Context) -> Any:
        kind = self.annotation
        if isinstance(value, kind) and not (kind is int and isinstance(value, bool)):
            return value
        text = str(value)
        if kind is bool and text.strip().lower() in _TRUE | _FALSE:
            return text.strip().lower() in _TRUE
        if kind is not bool:
            try:
                return kind(text)
            except (TypeError, ValueError):
                pass
        shown = text if len(text) <= 80 else text[:80] + "..."
        label = {int: "whole number", float: "number", bool: "boolean (true or false)"}.get(kind, kind.__name__)
        raise _click.exceptions.BadParameter(f"{shown!r} is not a valid {label}.", ctx=ctx, param=param)


_PLAIN_TYPES = (str, int, float, bool, Path)
_typer_runtime_param = _TyperParameter.get_runtime_param


def _runtime_param(self: _TyperParameter) -> RuntimeParam:
    if self._runtime_param is None and self.type_descriptor.annotation in _PLAIN_TYPES:
        self._runtime_param = _PlainParam(self.type_descriptor.parameter_info, self.type_descriptor.annotation)
    return _typer_runtime_param(self)


# Every parameter Typer builds (help options included) asks this for its coercion.
_TyperParameter.get_runtime_param = _runtime_param  # type: ignore[method-assign]


def register_all() -> None:
    """Import every command module (tests and shell completion want the whole app)."""
    import importlib

    for module in dict.fromkeys(m for m, _ in LazyGroup.table.values()):
        importlib.import_module(module)


class LazyGroup(TyperGroup):
    """The root group: lists commands from its table and builds one only when it is used.

    The table (``COMMANDS`` of ``broker.cli.commands``) is set by ``broker.cli`` when it is
    imported: the command modules import this one, so this one does not name them.
    """

    table: ClassVar[dict[str, tuple[str, str]]] = {}
    hidden_names: ClassVar[frozenset[str]] = frozenset()
    _listing = False

    def list_commands(self, ctx: _click.Context) -> list[str]:
        names = [n for n in self.table if n not in self.hidden_names]
        return names + [n for n in self.commands if n not in self.table]

    def get_command(self, ctx: _click.Context, cmd_name: str) -> _click.Command | None:
        if cmd_name in self.commands:
            return self.commands[cmd_name]
        if self._listing and cmd_name in self.table:
            short = self.table[cmd_name][1]
            return TyperCommand(name=cmd_name, help=short or None, hidden=cmd_name in self.hidden_names,
                                rich_markup_mode=None)
        if cmd_name in self.table:
            import importlib

            importlib.import_module(self.table[cmd_name][0])
        else:
            register_all()
        for name, command in typer.main.get_group(app).commands.items():
            self.commands.setdefault(name, command)
        return self.commands.get(cmd_name)

    def format_help(self, ctx: _click.Context, formatter: _click.HelpFormatter) -> None:
        self._listing = True
        try:
            super().format_help(ctx, formatter)
        finally:
            self._listing = False

    def resolve_command(self, ctx: _click.Context, args: list[str]) -> Any:
        try:
            return self._click_resolve_command(ctx, args)
        except _click.exceptions.UsageError as exc:
            from difflib import get_close_matches

            matches = get_close_matches(args[0], self.list_commands(ctx)) if args else []
            if matches:
                exc.message = f"{exc.message.rstrip('.')}. Did you mean {', '.join(repr(m) for m in matches)}?"
            raise


app = typer.Typer(
    name="broker",
    cls=LazyGroup,
    help="Run GPU training on the cheapest spot capacity across AWS, GCP and Azure without losing work.",
    no_args_is_help=True,
    add_completion=True,
    context_settings={"help_option_names": ["-h", "--help"]},  # every command inherits both
    pretty_exceptions_enable=False,
    # Plain help (no Rich): flags print as flags, `[env var: ...]` is shown, and help starts fast.
    rich_markup_mode=None,
)


def _wide_console(stderr: bool = False) -> Console:
    from rich.console import Console, ConsoleDimensions

    class CliConsole(Console):
        """A terminal gets its own width; a pipe or file gets every column whole, as in the terminal."""

        @property
        def size(self) -> ConsoleDimensions:
            size = Console.size.fget(self)  # type: ignore[attr-defined]
            if not self.is_terminal:  # even when COLUMNS is set: a pipe has no width to fit
                return ConsoleDimensions(PIPE_WIDTH, size.height)
            return size  # type: ignore[no-any-return]

        @size.setter
        def size(self, new_size: tuple[int, int]) -> None:
            Console.size.fset(self, new_size)  # type: ignore[attr-defined]

        def on_broken_pipe(self) -> None:
            # Rich exits 1 here; `broker.cli.main` exits 0 instead: the reader (`| head -1`) had what it wanted.
            raise BrokenPipeError(32, "the reader of the output closed it")

    # NO_COLOR alone would still leave bold and dim: without a colour system Rich writes no escapes at all.
    return CliConsole(stderr=stderr, no_color=_no_color() or None, color_system=None if _no_color() else "auto")


def make_console(stderr: bool = False) -> Console:
    """A console that prints whole tables into pipes and honours NO_COLOR / --no-color."""
    return _wide_console(stderr)


def _no_color() -> bool:
    return bool(os.environ.get("NO_COLOR"))


_consoles: dict[str, Console] = {}


def __getattr__(name: str) -> Any:
    # `console` and `err_console` are made on first use, so importing a command module stays cheap.
    if name in ("console", "err_console"):
        if name not in _consoles:
            _consoles[name] = make_console(stderr=name == "err_console")
        return _consoles[name]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


ConfigOption = Annotated[Path | None, typer.Option(
    "--config", envvar="BROKER_CONFIG", show_envvar=True,
    help="settings file (default $BROKER_HOME/config.yaml, i.e. ~/.broker/config.yaml)")]
JsonOption = Annotated[bool, typer.Option("--json", help="print JSON instead of a table")]


class UsageError(UserError):
    """A user error to print as one line and exit 2 (bad input, unknown job, missing file)."""


def _version(value: bool) -> None:
    if value:
        from importlib.metadata import PackageNotFoundError, version

        try:
            number = version("spot-broker")
        except PackageNotFoundError:  # run from a source tree that was never installed
            number = "unknown"
        print(f"broker {number}")
        raise typer.Exit()


def _set_no_color(value: bool) -> None:
    if value:
        os.environ["NO_COLOR"] = "1"  # consoles made from now on, and Rich's own default, see it
        for made in _consoles.values():
            made.no_color = True
            made._color_system = None


@app.callback()
def _root(
    version: Annotated[bool, typer.Option("--version", callback=_version, is_eager=True,
                                          help="print the broker's version and exit")] = False,
    no_color: Annotated[bool, typer.Option("--no-color", callback=_set_no_color, is_eager=True,
                                           help="no colours or styles in the output (also when NO_COLOR is set)")]
    = False,
) -> None:
    """Run GPU training on the cheapest spot capacity across AWS, GCP and Azure without losing work."""
    # A Typer app with one command collapses into that command; the callback keeps `broker <command>`.
