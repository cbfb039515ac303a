"""What `broker` imports before it does anything: help must not pay for the engine's libraries."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from broker.cli.app import COMMANDS, HIDDEN, app, register_all

HEAVY = ("sqlalchemy", "fastapi", "numpy", "sky", "alembic", "matplotlib", "boto3", "botocore", "google",
         "azure", "pydantic", "uvicorn", "starlette", "httpx", "rich", "yaml")

_PROBE = """
import json, sys
sys.argv = ["broker", *json.loads(sys.argv[1])]
from broker.cli import main
try:
    main()
except SystemExit:
    pass
print("MODULES=" + json.dumps(sorted({m.split(".")[0] for m in sys.modules})))
"""


def _top_level_modules(*args: str) -> set[str]:
    done = subprocess.run([sys.executable, "-c", _PROBE, json.dumps(list(args))], capture_output=True, text=True,
                          timeout=120)
    line = next(ln for ln in done.stdout.splitlines() if ln.startswith("MODULES="))
    return set(json.loads(line.removeprefix("MODULES=")))


def test_help_imports_none_of_the_heavy_libraries() -> None:
    loaded = _top_level_modules("--help")
    assert not loaded & set(HEAVY), sorted(loaded & set(HEAVY))
    assert "typer" in loaded  # the probe did run the CLI


@pytest.mark.parametrize("command", ["launch", "status", "cancel", "logs", "prices", "report", "serve", "token"])
def test_a_commands_help_imports_none_of_the_engines_libraries(command: str) -> None:
    loaded = _top_level_modules(command, "--help")
    engine_libraries = {"sqlalchemy", "fastapi", "numpy", "sky", "alembic", "matplotlib", "boto3", "google", "azure",
                        "pydantic"}
    assert not loaded & engine_libraries, sorted(loaded & engine_libraries)


def test_the_help_lines_of_the_command_table_are_the_commands_own() -> None:
    import typer.main

    register_all()
    commands = typer.main.get_group(app).commands
    assert set(commands) == set(COMMANDS)
    for name, (_, short) in COMMANDS.items():
        if name in HIDDEN:
            continue
        own = commands[name].help or ""
        assert own.split("\n\n")[0].replace("\n", " ").strip() == short, name


def test_status_against_a_server_imports_no_store_and_no_http_library(tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """The client is the standard library's http.client: httpx alone imported Rich's progress bars and Pygments."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again: the probe's request is refused, after every import it needs
    monkeypatch.setenv("BROKER_TOKEN", "bkr_probe")
    loaded = _top_level_modules("status", "--server", f"http://127.0.0.1:{port}")
    assert "http" in loaded  # the probe did reach the client
    assert not loaded & {"sqlalchemy", "alembic", "httpx", "httpcore", "pygments", "fastapi", "pydantic", "numpy",
                         "sky"}, sorted(loaded)


def test_a_migrated_stores_status_does_not_import_alembic(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from broker.store import open_store

    open_store(f"sqlite:///{tmp_path / 'store.db'}").dispose()  # migrated once, as the first command does
    monkeypatch.setenv("BROKER_DB_URL", f"sqlite:///{tmp_path / 'store.db'}")
    loaded = _top_level_modules("status")
    assert "sqlalchemy" in loaded and "alembic" not in loaded


def test_a_store_behind_the_newest_migration_is_still_migrated(tmp_path: Path) -> None:
    from alembic import command
    from sqlalchemy import inspect

    from broker.store import open_store
    from broker.store.db import alembic_config, head_revision

    url = f"sqlite:///{tmp_path / 'store.db'}"
    store = open_store(url)
    command.downgrade(alembic_config(url), "0009_sharing")
    assert not store.at_head() and "ledger_rollup" not in inspect(store.engine).get_table_names()
    store.dispose()
    store = open_store(url)
    assert store.at_head() and head_revision() is not None
    assert "ledger_rollup" in inspect(store.engine).get_table_names()
    store.dispose()
