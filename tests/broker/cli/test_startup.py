"""What `broker` imports before it does anything: help must not pay for the engine's libraries."""

from __future__ import annotations

import json
import subprocess
import sys

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
