"""Job commands: launch, status, cancel, logs."""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from broker.cli import remote
from broker.cli.app import ConfigOption, JsonOption, UsageError, app
from broker.cli.driving import drive, job_summary_of
from broker.cli.engine import revive, revive_if, spawn_engine
from broker.cli.job_output import announce, announce_pipeline, finish, print_status

if TYPE_CHECKING:
    from datetime import datetime

    from broker.config.settings import Settings
    from broker.spec.job import JobSpec, Pipeline
    from broker.store import Store

# Everything heavy (the engine, SQLAlchemy, the store, SkyPilot through the job file reader) is
# imported inside the command that needs it, so `broker --help` and `broker status --server` stay fast.


def _read_job(job_file: Path, settings: Settings) -> JobSpec | Pipeline:
    """The job file as ``broker.intake`` reads it (on SkyPilot, judged by the price book's offers first)."""
    from broker.intake import Intake, read_job
    from broker.spec.job import read_job_file

    text = read_job_file(job_file)
    if settings.backend != "skypilot":
        return read_job(text, str(job_file), Intake(settings.home, settings.backend), None)
    from broker.store import open_store

    store = open_store(settings.database_url)
    try:
        return read_job(text, str(job_file), Intake(settings.home, settings.backend), store)
    finally:
        store.dispose()


def _precheck(job_file: Path) -> None:
    """The job file judged on its own (no catalog, no market, no settings, no SkyPilot: its schema as the
    broker keeps it), before the settings, the store and the engine are imported: a file the broker or
    SkyPilot's schema refuses is refused in well under a second.
    The full reading (``_read_job``) follows for a file that passes."""
    from broker.spec.job import SpecError, parse_job_file, read_job_file

    try:
        parse_job_file(read_job_file(job_file), source=str(job_file), offline=True, skypilot=False)
    except SpecError as exc:
        # The built-in catalog's answer is not the last word: the full reading judges by the market (local)
        # or SkyPilot's catalog, and a job the market offers is never refused.
        if "offline validation" not in exc.detail:
            raise


def _refresh_sky_prices(store: Store, settings: Settings, spec: JobSpec, quiet: bool) -> None:
    from broker.cli.app import err_console
    from broker.cli.sky_launch import refresh_prices

    for line in refresh_prices(store, settings, spec):
        if not quiet:
            err_console.print(f"prices: {line}", highlight=False, markup=False)


MarketClockOption = Annotated[str, typer.Option(
    "--market-clock", envvar="BROKER_MARKET_CLOCK", show_envvar=True,
    help="local backend: 'own' starts this job's market at the trace's first tick (the quickstart reproduces); "
         "'shared' joins the market clock already running in this broker home")]


@app.command()
def launch(
    job_file: Annotated[Path, typer.Argument(help="SkyPilot task YAML with an optional broker: section")],
    backend: Annotated[str | None, typer.Option(help="where clusters come from: local or skypilot",
                                                envvar="BROKER_BACKEND", show_envvar=True)] = None,
    market: Annotated[Path | None, typer.Option(help="market trace CSV for the local backend (default: the bundled "
                                                     "quickstart market)",
                                                envvar="BROKER_MARKET", show_envvar=True)] = None,
    speed: Annotated[float | None, typer.Option(help="local backend: market seconds per wall second (default 60)",
                                                envvar="BROKER_SPEED", show_envvar=True)] = None,
    market_clock: MarketClockOption = "own",
    detach: Annotated[bool, typer.Option("--detach", help="submit, print the job id and return")] = False,
    dryrun: Annotated[bool, typer.Option("--dryrun", help="skypilot: print the plan and task, run SkyPilot's "
                                         "dry run, launch nothing")] = False,
    config: ConfigOption = None,
    as_json: JsonOption = False,
    server: remote.ServerOption = None,
) -> None:
    """Validate a job file, run it on the cheapest spot capacity, and follow it to the end."""
    if market_clock not in ("own", "shared"):
        raise UsageError(f"--market-clock: expected own or shared, got {market_clock[:80]!r}")
    if (served := remote.server_settings(config, server)) is not None:
        return remote.launch(remote.full_settings(config, served), job_file, detach, as_json)
    _precheck(job_file)
    from broker.config.settings import load_settings
    from broker.spec.job import Pipeline

    settings = load_settings(config, backend=backend, market=market, speed=speed)
    if settings.backend not in ("local", "skypilot"):
        raise UsageError(f"--backend {settings.backend}: expected local or skypilot")
    if dryrun and settings.backend != "skypilot":
        raise UsageError("--dryrun: only with --backend skypilot (the local backend has nothing to dry-run)")
    loaded = _read_job(job_file, settings)
    _warn(loaded)
    if isinstance(loaded, Pipeline):
        if dryrun:
            raise UsageError(f"--dryrun: {job_file} is a {len(loaded.stages)}-stage {loaded.kind}; dry-run "
                             "one task file at a time")
        return _launch_pipeline(settings, loaded, market_clock == "own", detach, as_json, config)
    spec = loaded
    if dryrun:
        from broker.cli.sky_dryrun import dryrun as sky_dryrun

        if not sky_dryrun(settings, spec, as_json=as_json):
            raise typer.Exit(1)
        return
    from broker.runtime import assemble

    runtime = assemble(settings, fresh_market=market_clock == "own")
    try:
        (job_id,) = runtime.submit(spec)
        if settings.backend == "skypilot":  # before the engine starts, which decides on these quotes
            _refresh_sky_prices(runtime.store, settings, spec, as_json)
        if detach:
            spawn_engine(config, settings.home)  # exits at once if an engine already drives this home
        announce(job_id, spec.name, spec.num_nodes, detach, as_json)
        if detach:
            return
        drive(runtime, settings, job_id, show=not as_json)
        summary = job_summary_of(runtime.store, job_id)
    finally:
        runtime.close()
    finish(summary, as_json)


def _warn(loaded: JobSpec | Pipeline) -> None:
    """What validation let pass but changed (accelerator choices no cloud sells), one line each on stderr."""
    from rich.markup import escape

    from broker.cli.app import err_console
    from broker.spec.job import Pipeline

    for spec in loaded.stages if isinstance(loaded, Pipeline) else (loaded,):
        for line in spec.warnings:
            err_console.print(f"warning: {escape(line)}", soft_wrap=True, highlight=False)


def _launch_pipeline(settings: Settings, pipeline: Pipeline, fresh_market: bool, detach: bool, as_json: bool,
                     config: Path | None) -> None:
    """Submit every stage (a chain's stages wait for the one before them) and follow them to the end."""
    from broker.cli.job_output import finish_pipeline
    from broker.runtime import assemble

    runtime = assemble(settings, fresh_market=fresh_market)
    try:
        job_ids = runtime.submit(pipeline)
        announce_pipeline(pipeline.name, pipeline.kind, job_ids,
                          [(stage.name, stage.num_nodes) for stage in pipeline.stages], detach, as_json)
        if detach:
            spawn_engine(config, settings.home)
            return
        drive(runtime, settings, job_ids, show=not as_json)
        summaries = [job_summary_of(runtime.store, job_id) for job_id in job_ids]
    finally:
        runtime.close()
    finish_pipeline(pipeline.name, summaries, as_json)


def _open(config: Path | None) -> tuple[Settings, Store]:
    from broker.config.settings import load_settings
    from broker.store import open_store

    settings = load_settings(config)
    return settings, open_store(settings.database_url)


def store_url(config: Path | None) -> str:
    """The store's URL as the settings model derives it (BROKER_DB_URL, then the file, then home).

    `broker status` reads only this, so it does not pay for importing the whole settings model; a
    settings file that says anything is judged whole, as every other command judges it.
    """
    import os

    from broker.config.file import checked

    if remote.read_settings_file(config):
        from broker.config.settings import load_settings

        return load_settings(config).database_url
    url = os.environ.get("BROKER_DB_URL")
    if url:
        return checked("db_url", url)
    home = os.environ.get("BROKER_HOME")
    return f"sqlite:///{Path(checked('home', home)) if home else Path.home() / '.broker'}/broker.db"


def replay_now(url: str) -> datetime | None:
    """The replayed market's clock now, when the store is the embedded default's and a replay has begun
    (its ``local/world.json`` beside the store): progress estimates run on it, as the engine's and the
    dashboard's do. Read with the standard library, like the rest of ``status``."""
    import json

    from broker.clock import AcceleratedClock
    from broker.status.readonly import sqlite_path

    path = sqlite_path(url)
    try:
        data = json.loads((path.parent / "local" / "world.json").read_text()) if path else None
        return AcceleratedClock(float(data["wall_origin"]), float(data["speed"])).now() if data else None
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _local_summaries(config: Path | None, job_id: str | None, state: str | None = None,
                     newest: int | None = None) -> list[dict[str, Any]]:
    """The summaries ``status`` prints, read without SQLAlchemy when the store allows (``broker.status.readonly``)."""
    from broker.status.readonly import READ_ERRORS, open_readonly
    from broker.status.summary import summaries

    url = store_url(config)
    fast = open_readonly(url)
    if fast is None:
        return _orm_summaries(config, url, job_id, state, newest)
    idle: tuple[int, int] | None = None
    try:
        with fast.snapshot():
            found = summaries(fast, job_id, clock_now=replay_now(url), state=state, newest=newest)
            idle = fast.unattended()
    except READ_ERRORS:
        pass
    finally:
        fast.close()
    if idle is None:  # a store sqlite3 cannot read as it stands: SQLAlchemy's path says why, as it always did
        return _orm_summaries(config, url, job_id, state, newest)
    if found is None:
        raise UsageError(f"no job {job_id!r}")
    revive_if(config, *idle)
    return found


def _orm_summaries(config: Path | None, url: str, job_id: str | None, state: str | None = None,
                   newest: int | None = None) -> list[dict[str, Any]]:
    """The same through SQLAlchemy: PostgreSQL, or a SQLite store not there yet or behind a migration."""
    from sqlalchemy.exc import DBAPIError

    from broker.status.orm_source import SessionSource
    from broker.status.summary import summaries
    from broker.store import open_store
    from broker.store.db import store_error

    store = open_store(url)
    try:
        try:
            with store.transaction() as s:
                found = summaries(SessionSource(s), job_id, clock_now=replay_now(url), state=state, newest=newest)
        except (DBAPIError, ValueError, TypeError) as exc:  # a value no column type reads: not as migrations left it
            raise store_error("read", url, exc) from exc
        if found is None:
            raise UsageError(f"no job {job_id!r}")
        revive(config, store)
        return found
    finally:
        store.dispose()


DEFAULT_LISTED = 100  # jobs `broker status` shows without a job id
MAX_LISTED = 10_000


@app.command()
def status(
    job_id: Annotated[str | None, typer.Argument(help="a job id; the newest jobs when omitted")] = None,
    state: Annotated[str | None, typer.Option("--state", help="only jobs in this state, e.g. running")] = None,
    limit: Annotated[int, typer.Option("--limit", help=f"at most this many jobs, the newest (1 to {MAX_LISTED})")]
    = DEFAULT_LISTED,
    config: ConfigOption = None,
    as_json: JsonOption = False,
    server: remote.ServerOption = None,
) -> None:
    """Show one job, or the newest jobs (oldest of them first), with cost, preemptions and where it runs."""
    from broker.model import JobState

    if state is not None and state.upper() not in {s.value for s in JobState}:
        raise UsageError(f"--state: expected one of {', '.join(s.value.lower() for s in JobState)}, got {state[:40]!r}")
    if not 1 <= limit <= MAX_LISTED:
        raise UsageError(f"--limit: expected 1 to {MAX_LISTED} jobs, got {limit}")
    wanted = state.upper() if state else None
    if (served := remote.server_settings(config, server)) is not None:
        summaries = remote.summaries(served, job_id, wanted, limit + 1)
    else:
        summaries = _local_summaries(config, job_id, wanted, limit + 1)
    if job_id is None and len(summaries) > limit:  # one more than asked: there are older ones
        summaries = summaries[1:]
        from broker.cli.app import err_console

        err_console.print(f"the newest {limit} jobs; older ones with --limit (at most {MAX_LISTED})", highlight=False)
    print_status(summaries, job_id, as_json)


@app.command()
def cancel(job_id: Annotated[str, typer.Argument(help="the job's id")], config: ConfigOption = None,
           server: remote.ServerOption = None) -> None:
    """Cancel a job; its clusters are torn down by the engine's next step."""
    from broker.cli.app import console
    from broker.cli.job_output import TERMINAL, shown

    before: str | None = None  # its state before (the store's): a job already CANCELLED has nothing to cancel
    if (served := remote.server_settings(config, server)) is not None:
        state = remote.cancel(served, job_id)
    else:
        from broker.engine.machine import cancel_job
        from broker.runtime import broker_clock
        from broker.store.tables import JobRow

        settings, store = _open(config)
        try:
            with store.transaction() as s:
                row = s.get(JobRow, job_id)
                before = row.state if row is not None else None
            state = cancel_job(store, job_id, broker_clock(settings))
            revive(config, store)  # an engine tears its clusters down
        finally:
            store.dispose()
        if before in TERMINAL:
            state = before or state
    if state != "CANCELLED" or before in TERMINAL:
        from broker.cli.app import err_console

        err_console.print(f"{shown(job_id)} had already ended ({shown(state)}): nothing to cancel", highlight=False)
        raise typer.Exit(1)
    console.print(f"{job_id}: {state}")


@app.command()
def logs(
    job_id: Annotated[str, typer.Argument(help="the job's id")],
    follow: Annotated[bool, typer.Option("--follow", "-f", help="keep printing until the job ends")] = False,
    config: ConfigOption = None,
    server: remote.ServerOption = None,
) -> None:
    """Print a job's output, every attempt and node in order."""
    if (served := remote.server_settings(config, server)) is not None:
        return remote.logs(served, job_id, follow)
    from broker.model import JobState
    from broker.status.joblogs import print_chunks, read_new

    settings, store = _open(config)
    try:
        job_summary_of(store, job_id)
        revive(config, store)
        offsets: dict[str, int] = {}
        while True:
            chunks = read_new(settings.home, job_id, offsets)
            print_chunks(chunks, offsets)
            if chunks:
                continue
            if not follow or JobState(job_summary_of(store, job_id)["state"]).terminal:
                break
            time.sleep(0.5)
    finally:
        store.dispose()
