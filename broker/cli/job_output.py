"""What the job commands print, the same whether the answers come from the store or a `broker serve`.

``broker/cli/jobs.py`` (embedded) and ``broker/cli/remote.py`` (``--server``) both print through
these, so neither imports the other.
"""

from __future__ import annotations

import json
import re
from typing import TYPE_CHECKING, Any

import typer

if TYPE_CHECKING:
    from rich.table import Table

SUCCEEDED, PENDING = "SUCCEEDED", "PENDING"  # broker.model.JobState values, without importing the engine's model
TERMINAL = ("SUCCEEDED", "FAILED", "CANCELLED")
# Control characters (C0, DEL, C1): a stored name with ESC [31m or a carriage return must not reach the terminal raw.
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")


def shown(value: object) -> str:
    """Stored text as the CLI prints it through Rich: control characters as \\xNN, markup escaped
    (a job named "[/x] hi" would otherwise make Rich raise and the whole listing fail)."""
    from rich.markup import escape

    return escape(_CONTROL.sub(lambda found: f"\\x{ord(found.group()):02x}", str(value)))


def progress_table(summary: dict[str, Any], progress: str) -> Table:
    """The one-row table an attached launch keeps updating."""
    from rich.table import Table

    table = Table(box=None, show_header=True, header_style="bold")
    for column in ("job", "state", "where", "$/h", "progress", "preemptions", "cost"):
        table.add_column(column, no_wrap=column != "progress")
    where = f"{summary['cloud']}/{summary['zone']}" if summary["zone"] else "-"
    if summary["spot"] is False:
        where += " (on-demand)"
    price = f"{summary['price_per_hour']:.2f}" if summary["price_per_hour"] is not None else "-"
    table.add_row(shown(summary["job_id"]), shown(summary["state"]), shown(where), price, shown(progress[-60:] or "-"),
                  str(summary["preemptions"]), f"${summary['cost']:.4f}")
    return table


def status_table(summaries: list[dict[str, Any]]) -> Table:
    from rich.table import Table

    table = Table(header_style="bold")
    for column in ("job", "name", "team", "state", "where", "progress", "finish (market)", "earlier predictions",
                   "preemptions", "migrations", "cost", "on-demand"):
        table.add_column(column, no_wrap=column not in ("name", "finish (market)", "earlier predictions"))
    for item in summaries:
        where = f"{item['cloud']}/{item['zone']}" if item["zone"] else "-"
        state = f"{item['state']} ({item['checkpoint_reason']})" if item.get("checkpoint_reason") else item["state"]
        name = f"{item['name']} (stage {item['stage']} of {item['pipeline_id']})" if item.get("stage") else item["name"]
        table.add_row(shown(item["job_id"]), shown(name), shown(item["team"]), shown(state), shown(where),
                      shown(progress_cell(item)),
                      finish_cell(item), earlier_cell(item), str(item["preemptions"]),
                      str(item["migrations"]), f"${item['cost']:.4f}", f"${item['on_demand_cost']:.4f}")
    return table


def progress_cell(item: dict[str, Any]) -> str:
    """The job's one progress figure (``broker.status.progress``), as the dashboard shows it."""
    if item.get("progress_text"):
        return str(item["progress_text"])
    progress = item.get("progress")  # a server from before the one figure
    if not progress:
        return "-"
    if progress.get("total"):
        return f"{progress['step']}/{progress['total']} ({100 * progress['step'] / progress['total']:.0f}%)"
    return f"step {progress['step']}"


def _clock(iso: str) -> str:
    return iso[11:19]  # HH:MM:SS of an ISO timestamp


def finish_cell(item: dict[str, Any]) -> str:
    """The predicted finish and its interval while the job is active; when it ended, the prediction's error."""
    if item["state"] == SUCCEEDED and item.get("prediction_error_s") is not None:
        return f"{_clock(item['finished_at'])} (predictions off by {item['prediction_error_s']:.0f} s)"
    if item.get("predicted_finish") is None or item["state"] in TERMINAL:
        return "-"
    return (f"{_clock(item['predicted_finish'])} ({_clock(item['predicted_finish_low'])}-"
            f"{_clock(item['predicted_finish_high'])}, {item['prediction_source']})")


def earlier_cell(item: dict[str, Any]) -> str:
    earlier = item.get("earlier_prediction_error")
    if not earlier:
        return "-"
    return f"off by {earlier['median_error_s']:.0f} s ({earlier['median_error_pct']:.0f}%), {earlier['jobs']} job(s)"


def print_status(summaries: list[dict[str, Any]], job_id: str | None, as_json: bool) -> None:
    if as_json:
        print(json.dumps(summaries[0] if job_id else summaries))
    else:
        from broker.cli.app import console

        console.print(status_table(summaries))
        for item in summaries:  # why a job failed (or waits), where the engine said
            if item.get("reason"):
                console.print(f"{shown(item['job_id'])} {shown(item['state'])}: {shown(item['reason'])}",
                              highlight=False)


def announce(job_id: str, name: str, num_nodes: int, detach: bool, as_json: bool) -> None:
    """The line a launch prints once the job is recorded (the JSON object instead, when detached)."""
    from broker.cli.app import console

    if detach and as_json:
        print(json.dumps({"job_id": job_id, "state": PENDING}))
    elif detach:
        console.print(f"submitted [bold]{job_id}[/bold]; follow it with `broker logs {job_id} --follow`")
    elif not as_json:
        console.print(f"submitted [bold]{shown(job_id)}[/bold] ({shown(name)}, {num_nodes} node(s))")


def announce_pipeline(name: str, kind: str, job_ids: list[str], stages: list[tuple[str, int]], detach: bool,
                      as_json: bool) -> None:
    """What a launch of a pipeline prints once its stages ((name, nodes) each) are recorded."""
    from broker.cli.app import console

    if detach and as_json:
        print(json.dumps({"pipeline": name, "kind": kind, "job_ids": job_ids, "state": PENDING}))
        return
    if as_json:
        return
    order = "one after another" if kind == "chain" else "together"
    console.print(f"submitted {kind} [bold]{shown(name)}[/bold]: {len(job_ids)} stages, run {order}")
    for number, (job_id, (stage, nodes)) in enumerate(zip(job_ids, stages, strict=True), start=1):
        console.print(f"  stage {number}  [bold]{shown(job_id)}[/bold] ({shown(stage)}, {nodes} node(s))")


def finish_pipeline(name: str, summaries: list[dict[str, Any]], as_json: bool) -> None:
    """How an attached launch of a pipeline ends: each stage's summary; exit 1 unless all succeeded."""
    if as_json:
        print(json.dumps({"pipeline": name, "stages": summaries}))
    else:
        for summary in summaries:
            print_summary(summary)
    if any(summary["state"] != SUCCEEDED for summary in summaries):
        raise typer.Exit(1)


def finish(summary: dict[str, Any], as_json: bool) -> None:
    """How an attached launch ends: the summary (or its JSON), and exit 1 unless the job succeeded."""
    if as_json:
        print(json.dumps(summary))
    else:
        print_summary(summary)
    if summary["state"] != SUCCEEDED:
        raise typer.Exit(1)


def print_summary(summary: dict[str, Any]) -> None:
    from broker.cli.app import console

    saving = f" ({summary['saving_pct']:.1f}% saved)" if summary["saving_pct"] is not None else ""
    job_id, name, state = shown(summary["job_id"]), shown(summary["name"]), shown(summary["state"])
    console.print(f"\n[bold]{job_id}[/bold] {name}: [bold]{state}[/bold]")
    console.print(f"  wall time        {summary['wall_seconds']:.1f} s")
    console.print(f"  cost             ${summary['cost']:.4f}")
    console.print(f"  on-demand cost   ${summary['on_demand_cost']:.4f}{saving}")
    console.print(f"  preemptions      {summary['preemptions']}")
    console.print(f"  migrations       {summary['migrations']}")
    console.print(f"  zones            {shown(' -> '.join(summary['zones']) or '-')}")
    console.print(f"  work lost        {summary['work_lost_seconds']:.0f} s (market clock)")
    if summary["reason"]:
        console.print(f"  reason           {shown(summary['reason'])}")
