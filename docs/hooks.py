"""MkDocs hooks: the README as the site's home page, and the reference pages generated from the code.

A reference page holds a marker (``<!-- generated: settings -->``); at build time it is replaced by a
table read from what the code declares: the settings model, the job file's ``broker:`` model, the
Typer commands, the service's OpenAPI schema and the metrics ``/metrics`` exports. A setting, field,
option, endpoint or metric added to the code appears in the docs without editing them.
"""

from __future__ import annotations

import re
import sys
import tempfile
import types
import typing
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # the hook is loaded by path; the broker is importable from the checkout
    sys.path.insert(0, str(ROOT))

MARKER = re.compile(r"<!-- generated: ([a-z-]+) -->")


def _cell(text: object) -> str:
    """One Markdown table cell: no line breaks, pipes escaped."""
    return " ".join(str(text).split()).replace("|", r"\|")


def _type_name(annotation: Any) -> str:
    if annotation is None or annotation is type(None):
        return "none"
    origin = typing.get_origin(annotation)
    if origin is typing.Annotated:
        return _type_name(typing.get_args(annotation)[0])
    if origin in (typing.Union, types.UnionType):
        return " or ".join(_type_name(a) for a in typing.get_args(annotation))
    if origin is typing.Literal:
        return " or ".join(repr(a) for a in typing.get_args(annotation))
    if origin is not None:
        args = ", ".join(_type_name(a) for a in typing.get_args(annotation) if a is not Ellipsis)
        return f"{getattr(origin, '__name__', str(origin))}[{args}]"
    return getattr(annotation, "__name__", str(annotation))


def _default(field: Any) -> str:
    from pydantic_core import PydanticUndefined

    if field.default_factory is not None:
        return "computed"
    if field.default is PydanticUndefined:
        return "required"
    if field.default is None:
        return "none"
    value = getattr(field.default, "value", field.default)
    return f"`{value}`"


def settings_reference() -> str:
    """Every setting: its name in the settings file, its environment variable, type, default and meaning."""
    from broker.config.settings import Settings

    prefix = Settings.model_config.get("env_prefix", "")
    rows = ["| setting | environment | type | default | meaning |", "|---|---|---|---|---|"]
    for name, field in Settings.model_fields.items():
        aliases = getattr(field.validation_alias, "choices", None)
        env = next((a for a in aliases or () if isinstance(a, str) and a.isupper()), None)
        env = env or f"{prefix}{name}".upper()
        rows.append(f"| `{name}` | `{env}` | {_cell(_type_name(field.annotation))} | {_cell(_default(field))} "
                    f"| {_cell(field.description or '')} |")
    return "\n".join(rows)


def _model_rows(model: Any, prefix: str = "") -> Iterator[str]:
    from pydantic import BaseModel

    for name, field in model.model_fields.items():
        inner = field.annotation
        if isinstance(inner, type) and issubclass(inner, BaseModel):
            yield from _model_rows(inner, f"{prefix}{name}.")
            continue
        yield (f"| `{prefix}{name}` | {_cell(_type_name(inner))} | {_cell(_default(field))} "
               f"| {_cell(field.description or '')} |")


def job_file_reference() -> str:
    """Every key of the ``broker:`` section, nested keys dotted, with its type as validated and default."""
    from broker.spec.broker_section import BrokerModel

    rows = ["| key | type (as validated) | default | meaning |", "|---|---|---|---|"]
    rows.extend(_model_rows(BrokerModel))
    return "\n".join(rows)


def _commands(group: Any, ctx: Any, path: str) -> Iterator[tuple[str, Any]]:
    """Every leaf command under a group (Typer's own click, whose groups load their commands lazily)."""
    for name in group.list_commands(ctx):
        command = group.get_command(ctx, name)
        if command is None or command.hidden:
            continue
        if hasattr(command, "list_commands"):
            if command.params:  # a group that is a command itself too (`broker prices`)
                yield f"{path} {name}", command
            yield from _commands(command, type(ctx)(command, parent=ctx, info_name=name), f"{path} {name}")
        else:
            yield f"{path} {name}", command


def cli_reference() -> str:
    """Every command with its arguments and options, their environment variables and defaults, from Typer."""
    import typer.main

    from broker.cli.app import app

    root = typer.main.get_command(app)
    ctx_type = type(root.context_class(root))
    out: list[str] = []
    for path, command in _commands(root, ctx_type(root, info_name="broker"), "broker"):
        out.append(f"## `{path}`\n")
        help_text = (command.help or "").strip()
        if help_text:
            out.append(help_text.split("\n\n")[0].replace("\n", " ") + "\n")
        out.append("| argument or option | environment | default | meaning |")
        out.append("|---|---|---|---|")
        for param in command.params:
            if getattr(param, "hidden", False):
                continue
            is_option = param.param_type_name == "option"
            names = (", ".join(f"`{o}`" for o in [*param.opts, *param.secondary_opts]) if is_option
                     else f"`{(param.metavar or param.name or '').upper()}`")
            env = param.envvar if isinstance(param.envvar, str) else ", ".join(param.envvar or [])
            default = "computed" if callable(param.default) else param.default
            shown = f"`{default}`" if is_option and default not in (None, False, (), []) else ""
            out.append(f"| {names} | {_cell(f'`{env}`' if env else '')} | {_cell(shown)} "
                       f"| {_cell(getattr(param, 'help', None) or '')} |")
        out.append("")
    return "\n".join(out)


def _service_app(home: Path) -> Any:
    from broker.api.app import create_app
    from broker.clock import WallClock
    from broker.intake import Intake
    from broker.store import open_store

    store = open_store(f"sqlite:///{home / 'broker.db'}")
    return store, create_app(store, WallClock(), Intake(home, "local", None), is_leader=lambda: True)


def _schema_name(schema: dict[str, Any] | None) -> str:
    if not schema:
        return ""
    ref = schema.get("$ref") or next((s.get("$ref") for s in schema.get("anyOf", []) if "$ref" in s), None)
    return f"`{ref.rsplit('/', 1)[-1]}`" if ref else _cell(schema.get("type", ""))


def api_reference() -> str:
    """Every route of the service with its summary, parameters, body and answers, from its OpenAPI schema."""
    with tempfile.TemporaryDirectory() as home:
        store, app = _service_app(Path(home))
        try:
            schema = app.openapi()
        finally:
            store.dispose()
    rows = ["| method | path | what it does | parameters | body | answers |", "|---|---|---|---|---|---|"]
    for path, operations in sorted(schema["paths"].items()):
        for method, op in operations.items():
            params = ", ".join(f"`{p['name']}` ({p['in']})" for p in op.get("parameters", []))
            body = op.get("requestBody", {}).get("content", {})
            body_schema = next(iter(body.values()), {}).get("schema") if body else None
            answers = ", ".join(sorted(op.get("responses", {})))
            summary = op.get("summary") or op.get("description", "").split("\n")[0]
            rows.append(f"| {method.upper()} | `{path}` | {_cell(summary)} | {_cell(params)} "
                        f"| {_schema_name(body_schema)} | {_cell(answers)} |")
    models = sorted(schema.get("components", {}).get("schemas", {}).items())
    out = ["\n".join(rows), "", "## Bodies", ""]
    for name, model in models:
        props = model.get("properties", {})
        if not props:
            continue
        required = set(model.get("required", []))
        out.append(f"### `{name}`\n")
        out.append("| field | type | required | meaning |")
        out.append("|---|---|---|---|")
        for field, spec in props.items():
            kind = spec.get("type") or _schema_name(spec) or " or ".join(
                str(s.get("type", _schema_name(s))) for s in spec.get("anyOf", []))
            out.append(f"| `{field}` | {_cell(kind)} | {'yes' if field in required else ''} "
                       f"| {_cell(spec.get('description', ''))} |")
        out.append("")
    return "\n".join(out)


def metrics_reference() -> str:
    """Every metric the service's ``/metrics`` exports, with its type and help, scraped from a real app."""
    from fastapi.testclient import TestClient

    with tempfile.TemporaryDirectory() as home:
        store, app = _service_app(Path(home))
        try:
            with TestClient(app) as client:
                client.get("/v1/health")  # one request, so the latency histogram has a series
                body = client.get("/metrics").text
        finally:
            store.dispose()
    helps: dict[str, str] = {}
    kinds: dict[str, str] = {}
    for line in body.splitlines():
        if line.startswith("# HELP "):
            name, _, text = line[7:].partition(" ")
            helps[name] = text
        elif line.startswith("# TYPE "):
            name, _, kind = line[7:].partition(" ")
            kinds[name] = kind
    rows = ["| metric | type | meaning |", "|---|---|---|"]
    rows.extend(f"| `{name}` | {kinds.get(name, '')} | {_cell(helps[name])} |" for name in sorted(helps))
    return "\n".join(rows)


GENERATORS: dict[str, Callable[[], str]] = {
    "settings": settings_reference,
    "job-file": job_file_reference,
    "cli": cli_reference,
    "api": api_reference,
    "metrics": metrics_reference,
}


def expand(markdown: str) -> str:
    """The page with each ``<!-- generated: NAME -->`` marker replaced by its generated reference."""
    def replace(match: re.Match[str]) -> str:
        name = match.group(1)
        if name not in GENERATORS:
            raise ValueError(f"unknown generated reference {name!r}; known: {', '.join(GENERATORS)}")
        return GENERATORS[name]()

    return MARKER.sub(replace, markdown)


def readme_as_home(readme: str) -> str:
    """The README with its links made relative to docs/, for the site's home page."""
    return readme.replace("](docs/", "](")


# --- MkDocs event hooks ---


def on_files(files: Any, config: Any) -> Any:
    from mkdocs.structure.files import File

    files.append(File.generated(config, "index.md", content=readme_as_home((ROOT / "README.md").read_text())))
    return files


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    return expand(markdown)
