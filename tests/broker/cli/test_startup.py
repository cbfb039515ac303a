"""What `broker` imports before it does anything: help must not pay for the engine's libraries."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from broker.cli.app import app, register_all
from broker.cli.commands import COMMANDS, HIDDEN

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


_MODULES_PROBE = """
import json, sys
sys.argv = ["broker", *json.loads(sys.argv[1])]
from broker.cli import main
try:
    main()
except SystemExit:
    pass
print("MODULES=" + json.dumps(sorted(sys.modules)))
"""


def _modules(*args: str) -> set[str]:
    """Every module (not only the top-level package) a fresh `broker ARGS` imported."""
    done = subprocess.run([sys.executable, "-c", _MODULES_PROBE, json.dumps(list(args))], capture_output=True,
                          text=True, timeout=120)
    line = next(ln for ln in done.stdout.splitlines() if ln.startswith("MODULES="))
    return set(json.loads(line.removeprefix("MODULES=")))


@pytest.mark.parametrize("by_url", [False, True])
def test_embedded_status_imports_no_sqlalchemy_alembic_or_engine(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                by_url: bool) -> None:
    """On a migrated embedded store, `status` (table, JSON, one job) reads it with sqlite3: SQLAlchemy's
    import alone takes longer than the whole command may; nor does it import the engine."""
    import fcntl

    from tests.status_stores import store_with_every_kind_of_job

    home = tmp_path / "home"
    url = f"sqlite:///{tmp_path / 'elsewhere' / 'store.db'}" if by_url else f"sqlite:///{home / 'broker.db'}"
    store_with_every_kind_of_job(url)
    home.mkdir(exist_ok=True)
    monkeypatch.setenv("BROKER_HOME", str(home))
    if by_url:
        monkeypatch.setenv("BROKER_DB_URL", url)
    heavy = {"sqlalchemy", "alembic", "broker.engine", "broker.runtime", "broker.store.db", "broker.config.settings",
             "pydantic", "numpy", "sky", "fastapi"}
    # An engine drives the home (this test holds its lock), so `status` starts none on these made-up jobs.
    (home / "engine.lock").touch()
    with open(home / "engine.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        for args in (["status"], ["status", "--json"], ["status", "j-running"], ["status", "j-running", "--json"]):
            loaded = _modules(*args)
            assert "broker.status.readonly" in loaded and "broker.status.summary" in loaded, args  # it read the store
            assert "--json" in args or "rich.table" in loaded, args
            assert not {m for m in loaded if m.split(".")[0] in heavy or m in heavy}, args


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


def test_the_cli_never_imports_nvml_even_where_it_could(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Only the node agent reads GPUs (broker.agent.gpu): with a `pynvml` importable first on the path (the
    stand-in, as a GPU node would have the real one), `status` and `report` on measured jobs still leave it be."""
    from tests.status_stores import store_with_every_kind_of_job

    root = Path(__file__).resolve().parents[3]
    home = tmp_path / "home"
    store_with_every_kind_of_job(f"sqlite:///{home / 'broker.db'}")
    monkeypatch.setenv("BROKER_HOME", str(home))
    monkeypatch.setenv("PYTHONPATH", f"{root / 'tests' / 'fakenvml'}:{root}")
    probe = subprocess.run([sys.executable, "-c", "import pynvml; print(pynvml.__file__)"], capture_output=True,
                           text=True, timeout=60)
    assert "fakenvml" in probe.stdout  # importable: leaving it out below is the CLI's doing
    for args, read in ((["status", "j-running", "--json"], "broker.status.summary"),
                       (["report", "--json"], "broker.reports.build"), (["--help"], "broker.cli")):
        loaded = _modules(*args)
        assert read in loaded, args  # it did read the measured jobs
        assert not {m for m in loaded if m == "pynvml" or m.startswith("broker.agent.gpu")}, args


UNKNOWN_KEY = "name: t\nresources:\n  accelerators: V100:1\nrun: echo done\nnot_a_skypilot_key: 1\n"


def test_a_file_only_skypilots_schema_refuses_is_refused_before_skypilot_or_the_store_is_imported(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    job = tmp_path / "job.yaml"
    job.write_text(UNKNOWN_KEY)
    monkeypatch.setenv("BROKER_HOME", str(tmp_path / "home"))
    done = subprocess.run([sys.executable, "-c", _PROBE, json.dumps(["launch", str(job)])], capture_output=True,
                          text=True, timeout=120)
    assert done.stderr.strip() == (f"error: {job}:5: not_a_skypilot_key: SkyPilot: Invalid task YAML: Found "
                                   "unsupported field 'not_a_skypilot_key'.")
    line = next(ln for ln in done.stdout.splitlines() if ln.startswith("MODULES="))
    loaded = set(json.loads(line.removeprefix("MODULES=")))
    assert not loaded & {"sky", "sqlalchemy", "alembic", "numpy", "fastapi"}, sorted(loaded)
    assert not (tmp_path / "home" / "broker.db").exists()


def test_launch_detach_on_the_local_backend_imports_no_skypilot(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    from tests.broker.cli.running import run_cli

    job = tmp_path / "job.yaml"
    job.write_text(UNKNOWN_KEY.replace("not_a_skypilot_key: 1\n", ""))
    monkeypatch.setenv("BROKER_HOME", str(tmp_path / "home"))
    done = subprocess.run([sys.executable, "-c", _PROBE, json.dumps(["launch", str(job), "--backend", "local",
                                                                     "--detach", "--json"])],
                          capture_output=True, text=True, timeout=300)
    job_id = json.loads(done.stdout.split("\nMODULES=")[0])["job_id"]
    run_cli(["cancel", job_id], capsys)  # the engine it started ends with its only job
    loaded = set(json.loads(done.stdout.split("\nMODULES=")[1]))
    assert "sky" not in loaded and "sqlalchemy" in loaded  # it stored the job, without SkyPilot
