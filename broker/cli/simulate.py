"""``broker simulate``: replay a market trace and compare selection policies on one job."""

from __future__ import annotations

import json
import os
import tempfile
from datetime import timedelta
from pathlib import Path
from typing import Annotated, Any

import typer

from broker.cli.app import JsonOption, UsageError, app, console

# Bounds of the numeric flags: beyond them a figure is no longer a checkpoint, a price or a run.
MAX_CHECKPOINT_GB = 1_000_000.0
MAX_EGRESS_PER_GB = 1_000.0
MAX_STARTS = 100_000  # each start replays the trace once per policy


@app.command("simulate")
def simulate_command(
    job_file: Annotated[Path, typer.Argument(help="job file: a SkyPilot task YAML with a broker: section "
                                                 "(num_nodes, accelerators NAME:COUNT, broker.work, broker.deadline)")],
    market: Annotated[Path, typer.Option("--market", help="market trace (.csv or .csv.gz)")],
    policy: Annotated[str | None, typer.Option("--policy", help="policy names, comma-separated; default: all")] = None,
    starts: Annotated[int | None, typer.Option("--starts", help="this many random start ticks")] = None,
    seed: Annotated[int, typer.Option("--seed", help="seed for --starts")] = 0,
    start: Annotated[str | None, typer.Option("--start", help="one start time (ISO 8601); default: the trace's first "
                                                          "tick")] = None,
    restart_overhead: Annotated[str, typer.Option("--restart-overhead", help="time lost at every (re)start")] = "0.2h",
    checkpoint_gb: Annotated[float, typer.Option("--checkpoint-gb", help="checkpoint size to move")] = 50.0,
    egress_per_gb: Annotated[float, typer.Option("--egress-per-gb", help="USD per GB moved between regions")] = 0.02,
    json_output: JsonOption = False,
    timeline: Annotated[Path | None, typer.Option("--timeline", help="write a JSON line per tick of each run")] = None,
) -> None:
    """Compare selection policies on a job over a recorded market: cost, preemptions, deadlines."""
    from broker.engine.planning import JobLimits
    from broker.sim.market import Market, SimJob
    from broker.sim.runs import random_starts, run_all
    from broker.spec.job import load_job_spec, market_offers
    from providers.trace import parse_time, read_trace

    whole = read_trace(market)
    # Judged by the trace, not a catalog (the built-in one only words a choice the trace lacks and no cloud sells).
    spec = load_job_spec(job_file, offline=True, market=market_offers(whole.zones))
    if not spec.accelerators:
        raise UsageError(f"{job_file}: resources.accelerators: required for simulate, expected NAME:COUNT "
                         "(e.g. V100:1) to pick the trace's rows")
    if spec.broker.work is None:
        raise UsageError(f"{job_file}: broker.work: required for simulate, expected a duration like 48h")
    if not isinstance(spec.broker.deadline, timedelta):
        raise UsageError(f"{job_file}: broker.deadline: required for simulate, expected a duration after the "
                         "start like 60h")
    names = _policy_names(policy)
    overhead = _duration("--restart-overhead", restart_overhead)
    for flag, value, most in (("--checkpoint-gb", checkpoint_gb, MAX_CHECKPOINT_GB),
                              ("--egress-per-gb", egress_per_gb, MAX_EGRESS_PER_GB)):
        if not 0 <= value <= most:  # NaN fails both
            raise UsageError(f"{flag}: expected a number from 0 to {most:g}, got {value}")
    if starts is not None and start is not None:
        raise UsageError("--starts and --start: give one or the other")
    if starts is not None and not 1 <= starts <= MAX_STARTS:
        raise UsageError(f"--starts: expected a count from 1 to {MAX_STARTS}, got {starts}")
    if not 0 <= seed < 2**63:
        raise UsageError(f"--seed: expected a whole number from 0 to 2**63 - 1, got {seed}")

    # A choice tied to instance types (`instance_type` with `accelerators`) takes only their rows, as at placement.
    present = [a for a in spec.accelerators if whole.select(a.name, a.count, a.instance_types).zones]
    if not present:
        tied = any(a.instance_types for a in spec.accelerators)
        have = sorted({f"{z.accelerator}:{z.gpus_per_node}" + (f" ({z.instance_type})" if tied else "")
                       for z in whole.zones})
        wanted = ", ".join(f"{a.name}:{a.count}" + (f" on {'|'.join(a.instance_types)}" if a.instance_types else "")
                           for a in spec.accelerators)
        raise UsageError(f"{market}: no rows for accelerators {wanted}; the trace has {', '.join(have)}")
    if spec.num_nodes < 1:
        raise UsageError(f"{job_file}: num_nodes: expected a positive count, got {spec.num_nodes}")
    choice: list[dict[str, Any]] = []
    accelerator = present[0]
    speed = 1.0
    if len(present) > 1:
        accelerator, speed, choice = _choose_accelerator(whole, spec, present, _first_tick(whole, start))
    trace = whole.select(accelerator.name, accelerator.count, accelerator.instance_types)
    job = SimJob(num_nodes=spec.num_nodes, work_s=spec.broker.work.total_seconds() / speed,
                 deadline_s=spec.broker.deadline.total_seconds(), restart_overhead_s=overhead,
                 checkpoint_gb=checkpoint_gb, egress_per_gb=egress_per_gb, accelerator=accelerator.name,
                 gpus_per_node=accelerator.count, limits=JobLimits.of(spec))
    sim_market = Market(trace, spec.num_nodes)
    latest = sim_market.latest_start(job)
    if latest < 0:
        raise UsageError(f"{market}: the trace spans {trace.num_ticks * trace.tick_seconds / 3600:.1f} h, "
                         f"shorter than the job's deadline {job.deadline_s / 3600:.1f} h")
    if starts is not None:
        ticks = random_starts(sim_market, job, starts, seed)
    elif start is not None:
        try:
            when = parse_time(start)
        except ValueError:
            raise UsageError(f"--start: expected an ISO 8601 time, got {start!r}") from None
        tick = round((when - trace.start).total_seconds() / trace.tick_seconds)
        if not 0 <= tick <= latest:
            raise UsageError(f"--start: {start} leaves no room for the deadline inside the trace; expected a time "
                             f"between {_iso(sim_market, 0)} and {_iso(sim_market, latest)}")
        ticks = [tick]
    else:
        ticks = [0]

    summaries = run_all(sim_market, job, names, ticks)
    if timeline is not None:
        _write_timeline(timeline, sim_market, summaries)
    report: dict[str, Any] = {name: {"runs": [r.to_json() for r in s.runs], "mean": _rounded(s.mean)}
                              for name, s in summaries.items()}
    if json_output:
        console.print_json(json.dumps({**report, "gpu_choice": choice} if choice else report))
        return
    if choice:
        _print_choice(choice)
    _print_table(spec.name, job, sim_market, ticks, report)


def _first_tick(trace: Any, start: str | None) -> int:
    """The tick whose prices the GPU type is chosen by: the one ``--start`` names, else the first."""
    from providers.trace import parse_time

    if start is None:
        return 0
    try:
        tick = round((parse_time(start) - trace.start).total_seconds() / trace.tick_seconds)
    except ValueError:
        raise UsageError(f"--start: expected an ISO 8601 time, got {start!r}") from None
    return min(max(tick, 0), trace.num_ticks - 1)


def _choose_accelerator(whole: Any, spec: Any, present: list[Any],
                        tick: int) -> tuple[Any, float, list[dict[str, Any]]]:
    """The alternative whose unit of work is cheapest at ``tick`` (policies.speed): the lowest spot
    price among its zones that can take the gang then (any zone when none can), over its speed."""
    from policies.speed import rank_accelerators

    prices = []
    for alt in present:
        sub = whole.select(alt.name, alt.count, alt.instance_types)
        up = sub.available_nodes[tick] >= spec.num_nodes
        row = sub.spot_price[tick][up] if up.any() else sub.spot_price[tick]
        prices.append((alt.name, float(row.min())))
    ranked = rank_accelerators(prices, spec.accelerators[0].name, dict(spec.broker.speed))
    best = ranked[0]
    chosen = next(a for a in present if a.name == best.accelerator)
    table = [{"accelerator": f"{c.accelerator}:{next(a.count for a in present if a.name == c.accelerator)}",
              "speed": round(c.speed, 6), "spot_per_node_hour": round(c.hourly, 6),
              "per_node_hour_of_work": round(c.per_work, 6), "chosen": c is best} for c in ranked]
    return chosen, best.speed, table


def _print_choice(choice: list[dict[str, Any]]) -> None:
    from rich import box
    from rich.console import Console
    from rich.table import Table

    table = Table(title="GPU type: the cheapest unit of work (spot $ per node-hour / speed vs the first alternative)",
                  title_justify="left", box=box.SIMPLE_HEAD)
    for column in ("accelerator", "speed", "spot $/node-h", "$ per node-h of work", "chosen"):
        table.add_column(column, justify="left" if column == "accelerator" else "right", no_wrap=True)
    for row in choice:
        table.add_row(row["accelerator"], f"{row['speed']:.2f}", f"{row['spot_per_node_hour']:.3f}",
                      f"{row['per_node_hour_of_work']:.3f}", "yes" if row["chosen"] else "")
    out = console if console.is_terminal else Console(width=max(console.width, 150))
    out.print(table)


def _policy_names(option: str | None) -> list[str]:
    from policies import kinds

    known = kinds.selection.names()
    if option is None:
        return [n for n in known if n != "optimal"] + (["optimal"] if "optimal" in known else [])
    names = [n.strip() for n in option.split(",") if n.strip()]
    unknown = [n for n in names if n not in known]
    if unknown or not names:
        raise UsageError(f"--policy: unknown policy {', '.join(unknown) or '(none given)'}; "
                         f"expected one or more of {', '.join(known)}")
    return list(dict.fromkeys(names))


def _duration(flag: str, text: str) -> float:
    from broker.spec.job import SpecError, parse_duration

    if text.strip() in ("0", "0s", "0h", "0m"):
        return 0.0
    try:
        return parse_duration(text, flag).total_seconds()
    except SpecError:
        raise UsageError(f"{flag}: expected a duration like 0.2h, 12m or 720s, got {text!r}") from None


def _iso(market: Any, tick: int) -> str:
    from providers.trace import format_time

    return format_time(market.time_of(tick))


def _rounded(mean: dict[str, float]) -> dict[str, float]:
    return {k: round(v, 6) for k, v in mean.items()}


def _write_timeline(path: Path, market: Any, summaries: dict[str, Any]) -> None:
    """All of it or nothing: written beside the target, then moved over it."""
    from providers.trace import format_time

    path = path.expanduser()
    directory = path.parent if str(path.parent) else Path(".")
    if not directory.is_dir():
        raise UsageError(f"--timeline: no such directory {directory}")
    if path.exists() and not path.is_file():
        raise UsageError(f"--timeline: {path} is not a regular file")
    try:
        handle, temp = tempfile.mkstemp(dir=directory, prefix=f".{path.name}.", suffix=".tmp")
    except OSError as exc:
        raise UsageError(f"--timeline: cannot write in {directory}: {exc.strerror or exc}") from None
    try:
        with os.fdopen(handle, "w", encoding="utf-8") as out:
            for name, summary in summaries.items():
                for run in summary.runs:
                    for i, code in enumerate(run.locations.tolist()):
                        tick = run.start + i
                        line: dict[str, Any] = {"policy": name, "start": run.start, "tick": tick,
                                                "time": format_time(market.trace.time_of(tick)),
                                                "location": market.label(code)}
                        if run.zone is not None:
                            line["zone"] = run.zone
                        out.write(json.dumps(line) + "\n")
        os.replace(temp, path)
    except OSError as exc:
        Path(temp).unlink(missing_ok=True)
        raise UsageError(f"--timeline: cannot write {path}: {exc.strerror or exc}") from None
    except BaseException:
        Path(temp).unlink(missing_ok=True)
        raise


def _print_table(job_name: str, job: Any, market: Any, ticks: list[int], report: dict[str, Any]) -> None:
    from rich import box
    from rich.console import Console
    from rich.table import Table

    zones = ", ".join(market.labels)
    title = (f"{job_name}: {job.num_nodes} x {job.accelerator}:{job.gpus_per_node}, work {job.work_s / 3600:g} h, "
             f"deadline {job.deadline_s / 3600:g} h, {len(ticks)} start(s) over {zones}")
    table = Table(title=title, title_justify="left", box=box.SIMPLE_HEAD)
    with_optimal = any("cost_vs_optimal" in r["mean"] for r in report.values())
    columns = ["policy", "cost $", "vs on-demand"] + (["vs optimal"] if with_optimal else []) + [
        "spot h", "on-demand h", "preemptions", "migrations", "finish h", "deadline met"]
    for column in columns:
        table.add_column(column, justify="left" if column == "policy" else "right", no_wrap=True)
    for name, entry in report.items():
        mean = entry["mean"]
        row = [name, f"{mean['cost']:.2f}", f"{mean['cost_vs_on_demand']:.3f}"]
        if with_optimal:
            row.append(f"{mean['cost_vs_optimal']:.3f}")
        row += [f"{mean['spot_hours']:.1f}", f"{mean['on_demand_hours']:.1f}", f"{mean['preemptions']:.1f}",
                f"{mean['migrations']:.1f}", f"{mean['finish_hours']:.1f}", f"{mean['deadline_met']:.0%}"]
        table.add_row(*row)
    # Piped output gets rich's default 80 columns, too narrow for ten columns of figures.
    out = console if console.is_terminal else Console(width=max(console.width, 150))
    out.print(table)
