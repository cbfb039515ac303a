"""``broker simulate-fairshare``: replay a multi-team job trace against a fleet under the fair-share policy
and its baselines, and print what each team received against what it was owed."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import typer

from broker.cli.app import ConfigOption, JsonOption, UsageError, app, console

POLICIES = ("weighted_fair_share", "fifo", "static_quota")


@app.command("simulate-fairshare")
def simulate_fairshare(
    gpus: Annotated[int, typer.Option("--gpus", help="GPUs of the fleet")],
    trace: Annotated[Path | None, typer.Option("--trace", help="team trace CSV: team,job_id,num_gpus,"
                                                               "submit_time,duration[,priority]")] = None,
    philly: Annotated[Path | None, typer.Option("--philly", help="build the four-team trace from the Philly "
                                                                 "workloads in this traces directory")] = None,
    seed: Annotated[int, typer.Option("--seed", help="bursts of the Philly teams")] = 31,
    as_json: JsonOption = False,
    config: ConfigOption = None,
) -> None:
    """Replay a multi-team job trace on a fleet under fair share, FIFO and static quotas; shares, waits, reclaims."""
    from broker.config.settings import load_settings
    from broker.config.teams import policy_teams
    from broker.sim.fair_share import PHILLY_TEAMS, percentile, philly_teams, replay
    from broker.sim.team_trace import read_team_trace
    from broker.sim.workload import WorkloadError
    from policies import kinds

    if not 1 <= gpus <= 100_000:
        raise UsageError(f"--gpus: expected 1 to 100000 GPUs, got {gpus}")
    if not 0 <= seed <= 2**31:
        raise UsageError(f"--seed: expected 0 to {2**31}, got {seed}")
    if (trace is None) == (philly is None):
        raise UsageError("give one of --trace FILE or --philly DIR")
    settings = load_settings(config)
    if trace is not None:
        jobs = read_team_trace(trace)
    else:
        assert philly is not None
        try:
            jobs = philly_teams(philly, seed)
        except WorkloadError as exc:
            raise UsageError(f"--philly: {exc}") from None
    teams = policy_teams(settings.teams) if settings.teams else PHILLY_TEAMS if philly is not None else ()
    results = [replay(jobs, teams, gpus, kinds.fair_share.get(name), name,
                      half_life_s=settings.fair_share_half_life_seconds) for name in POLICIES]
    rows: list[dict[str, Any]] = []
    for r in results:
        waits = [w for t in r.teams.values() for w in t.waits_s]
        rows.append({
            "policy": r.policy, "utilisation": round(r.utilisation, 4),
            "utilisation_while_waiting": round(r.contended_utilisation, 4), "makespan_h": round(r.makespan_s / 3600, 2),
            "mean_wait_h": round(r.mean_wait_s / 3600, 3), "p95_wait_h": round(percentile(waits, 0.95) / 3600, 3),
            "worst_window_shortfall": round(r.worst_window_error, 4), "reclaims": len(r.handovers_s),
            "max_handover_s": max(r.handovers_s, default=0.0), "unfinished": r.unfinished,
            "teams": {team: {"received_over_owed": round(fig.received_gpu_s / fig.owed_gpu_s, 3) if fig.owed_gpu_s
                             else None, "worst_window_shortfall": round(fig.worst_window_error, 4),
                             "borrowed_gpu_hours": round(fig.borrowed_gpu_s / 3600, 2),
                             "reclaims_given": fig.reclaims, "mean_wait_h": round(sum(fig.waits_s) / len(fig.waits_s)
                                                                                  / 3600, 3) if fig.waits_s else None}
                      for team, fig in sorted(r.teams.items())},
        })
    if as_json:
        print(json.dumps({"jobs": len(jobs), "gpus": gpus, "policies": rows}))
        return
    from rich.table import Table

    from broker.cli.job_output import shown

    console.print(f"{len(jobs)} jobs of {len({j.team for j in jobs})} teams on {gpus} GPUs", highlight=False)
    table = Table(header_style="bold")
    for column in ("policy", "utilisation", "while jobs waited", "mean wait h", "p95 wait h", "worst window",
                   "reclaims", "unfinished"):
        table.add_column(column)
    for row in rows:
        table.add_row(str(row["policy"]), f"{row['utilisation']:.1%}", f"{row['utilisation_while_waiting']:.1%}",
                      f"{row['mean_wait_h']:.2f}", f"{row['p95_wait_h']:.2f}", f"{row['worst_window_shortfall']:.1%}",
                      str(row["reclaims"]), str(row["unfinished"]))
    console.print(table)
    per_team = Table(title="received / owed per team (worst one-hour window short)", header_style="bold")
    per_team.add_column("team")
    for row in rows:
        per_team.add_column(str(row["policy"]))
    names = sorted({team for row in rows for team in row["teams"]})
    for team in names:
        cells = []
        for row in rows:
            fig = row["teams"].get(team)
            ratio = "-" if fig is None or fig["received_over_owed"] is None else f"{fig['received_over_owed']:.2f}"
            cells.append(ratio if fig is None else f"{ratio} ({fig['worst_window_shortfall']:.0%})")
        per_team.add_row(shown(team), *cells)
    console.print(per_team)
