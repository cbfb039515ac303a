"""Job commands: launch, status, cancel, logs (and the engine loop a detached launch leaves behind)."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.live import Live
from rich.table import Table
from sqlalchemy import select

from broker.cli import remote
from broker.cli.app import ConfigOption, JsonOption, UsageError, app, console
from broker.config import Settings, load_settings
from broker.engine.machine import cancel_job, submit_job
from broker.joblogs import print_chunks, read_new
from broker.model import JobState
from broker.runtime import EmbeddedBroker, EngineLock, broker_clock, open_broker
from broker.spec import JobSpec, load_job_spec
from broker.store import Store, open_store
from broker.store.tables import JobRow
from broker.summary import job_summary, last_log_line


def _check_market_fits(broker: Any, spec: JobSpec) -> None:
    if not isinstance(broker, EmbeddedBroker):
        return  # SkyPilot's catalog: an unknown accelerator was refused when the job file was read
    zones = broker.market.trace.zones
    if spec.accelerators and not any(
        a.name.lower() == z.accelerator.lower() and a.count == z.gpus_per_node
        for a in spec.accelerators for z in zones
    ):
        wanted = ", ".join(f"{a.name}:{a.count}" for a in spec.accelerators)
        have = ", ".join(sorted({f"{z.accelerator}:{z.gpus_per_node}" for z in zones}))
        raise UsageError(f"resources.accelerators: no zone of the market offers {wanted} per node "
                         f"(the market has {have})")


def _summary(store: Store, job_id: str) -> dict[str, Any]:
    with store.transaction() as s:
        job = s.get(JobRow, job_id)
        if job is None:
            raise UsageError(f"no job {job_id!r}")
        return job_summary(s, job)


def _progress_table(summary: dict[str, Any], progress: str) -> Table:
    table = Table(box=None, show_header=True, header_style="bold")
    for column in ("job", "state", "where", "$/h", "progress", "preemptions", "cost"):
        table.add_column(column)
    where = f"{summary['cloud']}/{summary['zone']}" if summary["zone"] else "-"
    if summary["spot"] is False:
        where += " (on-demand)"
    price = f"{summary['price_per_hour']:.2f}" if summary["price_per_hour"] is not None else "-"
    table.add_row(summary["job_id"], summary["state"], where, price, progress[-60:] or "-",
                  str(summary["preemptions"]), f"${summary['cost']:.4f}")
    return table


def announce(job_id: str, name: str, num_nodes: int, detach: bool, as_json: bool) -> None:
    """The line a launch prints once the job is recorded (the JSON object instead, when detached)."""
    if detach and as_json:
        print(json.dumps({"job_id": job_id, "state": JobState.PENDING.value}))
    elif detach:
        console.print(f"submitted [bold]{job_id}[/bold]; follow it with `broker logs {job_id} --follow`")
    elif not as_json:
        console.print(f"submitted [bold]{job_id}[/bold] ({name}, {num_nodes} node(s))")


def finish(summary: dict[str, Any], as_json: bool) -> None:
    """How an attached launch ends: the summary (or its JSON), and exit 1 unless the job succeeded."""
    if as_json:
        print(json.dumps(summary))
    else:
        _print_summary(summary)
    if summary["state"] != JobState.SUCCEEDED.value:
        raise typer.Exit(1)


def _print_summary(summary: dict[str, Any]) -> None:
    saving = f" ({summary['saving_pct']:.1f}% saved)" if summary["saving_pct"] is not None else ""
    console.print(f"\n[bold]{summary['job_id']}[/bold] {summary['name']}: [bold]{summary['state']}[/bold]")
    console.print(f"  wall time        {summary['wall_seconds']:.1f} s")
    console.print(f"  cost             ${summary['cost']:.4f}")
    console.print(f"  on-demand cost   ${summary['on_demand_cost']:.4f}{saving}")
    console.print(f"  preemptions      {summary['preemptions']}")
    console.print(f"  migrations       {summary['migrations']}")
    console.print(f"  zones            {' -> '.join(summary['zones']) or '-'}")
    console.print(f"  work lost        {summary['work_lost_seconds']:.0f} s (market clock)")
    if summary["reason"]:
        console.print(f"  reason           {summary['reason']}")


def drive(broker: Any, settings: Settings, job_id: str | None, show: bool) -> None:
    """Run the engine (or, if another process holds the engine lock, watch) until the job ends."""
    lock = EngineLock(settings.home)
    engine = broker.start() if lock.acquire() else None
    if engine is None and job_id is None:
        return
    try:
        with Live(console=console, refresh_per_second=4, transient=False, auto_refresh=False) as live:
            while True:
                if engine is not None:
                    engine.step()
                if job_id is not None:
                    summary = _summary(broker.store, job_id)
                    if show:
                        live.update(_progress_table(summary, last_log_line(settings.home, job_id)), refresh=True)
                    if JobState(summary["state"]).terminal:
                        break
                elif engine is not None and not engine.active_jobs():
                    break
                time.sleep(settings.poll_seconds)
            if engine is not None:
                for _ in range(3):  # tear down and meter the final minutes
                    engine.step()
                    time.sleep(settings.poll_seconds)
    finally:
        lock.release()


@app.command()
def launch(
    job_file: Annotated[Path, typer.Argument(help="SkyPilot task YAML with an optional broker: section")],
    backend: Annotated[str | None, typer.Option(help="where clusters come from: local or skypilot")] = None,
    market: Annotated[Path | None, typer.Option(help="market trace CSV for the local backend")] = None,
    speed: Annotated[float | None, typer.Option(help="local backend: market seconds per wall second")] = None,
    detach: Annotated[bool, typer.Option("--detach", help="submit, print the job id and return")] = False,
    dryrun: Annotated[bool, typer.Option("--dryrun", help="skypilot: print the plan and task, run SkyPilot's "
                                         "dry run, launch nothing")] = False,
    config: ConfigOption = None,
    as_json: JsonOption = False,
    server: remote.ServerOption = None,
) -> None:
    """Validate a job file, run it on the cheapest spot capacity, and follow it to the end."""
    if (served := remote.server_settings(config, server)) is not None:
        return remote.launch(served, job_file, detach, as_json)
    settings = load_settings(config, backend=backend, market=market, speed=speed)
    if settings.backend not in ("local", "skypilot"):
        raise UsageError(f"--backend {settings.backend}: expected local or skypilot")
    if dryrun and settings.backend != "skypilot":
        raise UsageError("--dryrun: only with --backend skypilot (the local backend has nothing to dry-run)")
    spec = load_job_spec(job_file)
    if dryrun:
        from broker.cli.sky_dryrun import dryrun as sky_dryrun

        if not sky_dryrun(settings, spec):
            raise typer.Exit(1)
        return
    broker = open_broker(settings, fresh_market=True)
    try:
        _check_market_fits(broker, spec)
        job_id = submit_job(broker.store, broker.clock, spec, settings.home, broker.provisioner.name)
        if detach:
            _spawn_engine(config)  # exits at once if an engine already drives this home
        announce(job_id, spec.name, spec.num_nodes, detach, as_json)
        if detach:
            return
        drive(broker, settings, job_id, show=not as_json)
        summary = _summary(broker.store, job_id)
    finally:
        broker.close()
    finish(summary, as_json)


def _spawn_engine(config: Path | None) -> None:
    command = [sys.executable, "-m", "broker", "run-engine"]
    if config is not None:
        command += ["--config", str(config)]
    subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                     start_new_session=True)


@app.command("run-engine", hidden=True)
def run_engine(config: ConfigOption = None) -> None:
    """Drive the engine until no job is active (what `launch --detach` leaves running)."""
    settings = load_settings(config)
    lock = EngineLock(settings.home)
    if not lock.acquire():
        return  # another engine drives this broker home already
    lock.release()
    broker = open_broker(settings)
    try:
        drive(broker, settings, None, show=False)
    finally:
        broker.close()


def _open(config: Path | None) -> tuple[Settings, Store]:
    settings = load_settings(config)
    return settings, open_store(settings.database_url)


def _local_summaries(config: Path | None, job_id: str | None) -> list[dict[str, Any]]:
    _, store = _open(config)
    try:
        if job_id is not None:
            return [_summary(store, job_id)]
        with store.transaction() as s:
            return [job_summary(s, j) for j in s.scalars(select(JobRow).order_by(JobRow.created_at))]
    finally:
        store.dispose()


@app.command()
def status(
    job_id: Annotated[str | None, typer.Argument(help="a job id; all jobs when omitted")] = None,
    config: ConfigOption = None,
    as_json: JsonOption = False,
    server: remote.ServerOption = None,
) -> None:
    """Show one job, or every job, with cost, preemptions and where it runs."""
    if (served := remote.server_settings(config, server)) is not None:
        summaries = remote.summaries(served, job_id)
    else:
        summaries = _local_summaries(config, job_id)
    if as_json:
        print(json.dumps(summaries[0] if job_id else summaries))
        return
    table = Table(header_style="bold")
    for column in ("job", "name", "team", "state", "where", "preemptions", "migrations", "cost", "on-demand"):
        table.add_column(column)
    for item in summaries:
        where = f"{item['cloud']}/{item['zone']}" if item["zone"] else "-"
        state = f"{item['state']} ({item['checkpoint_reason']})" if item.get("checkpoint_reason") else item["state"]
        table.add_row(item["job_id"], item["name"], item["team"], state, where, str(item["preemptions"]),
                      str(item["migrations"]), f"${item['cost']:.4f}", f"${item['on_demand_cost']:.4f}")
    console.print(table)


@app.command()
def cancel(job_id: Annotated[str, typer.Argument()], config: ConfigOption = None,
           server: remote.ServerOption = None) -> None:
    """Cancel a job; its clusters are torn down by the engine's next step."""
    if (served := remote.server_settings(config, server)) is not None:
        console.print(f"{job_id}: {remote.cancel(served, job_id)}")
        return
    settings, store = _open(config)
    try:
        state = cancel_job(store, job_id, broker_clock(settings))
    finally:
        store.dispose()
    console.print(f"{job_id}: {state}")


@app.command()
def logs(
    job_id: Annotated[str, typer.Argument()],
    follow: Annotated[bool, typer.Option("--follow", "-f", help="keep printing until the job ends")] = False,
    config: ConfigOption = None,
    server: remote.ServerOption = None,
) -> None:
    """Print a job's output, every attempt and node in order."""
    if (served := remote.server_settings(config, server)) is not None:
        return remote.logs(served, job_id, follow)
    settings, store = _open(config)
    try:
        _summary(store, job_id)
        offsets: dict[str, int] = {}
        while True:
            chunks = read_new(settings.home, job_id, offsets)
            print_chunks(chunks, offsets)
            if chunks:
                continue
            if not follow or JobState(_summary(store, job_id)["state"]).terminal:
                break
            time.sleep(0.5)
    finally:
        store.dispose()
