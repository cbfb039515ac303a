"""``broker teams``: each team's share owed and GPUs held now, borrowed, waiting jobs, usage, budget and reclaims."""

from __future__ import annotations

import json
from typing import Annotated

import typer

from broker.cli.app import ConfigOption, app


@app.command()
def teams(
    as_json: Annotated[bool, typer.Option("--json", help="print JSON")] = False,
    config: ConfigOption = None,
) -> None:
    """Each team's share owed and GPUs held now, borrowed, waiting jobs, recent usage, budget left, reclaims."""
    from datetime import UTC, datetime

    from sqlalchemy import func, select

    from broker.config.settings import load_settings
    from broker.config.teams import FairShareConfig, fair_share_config
    from broker.status.teams import team_lines
    from broker.store import open_store
    from broker.store.tables import JobEventRow

    settings = load_settings(config)
    fair = fair_share_config(settings) or FairShareConfig(teams=(), capacity_gpus=settings.capacity_gpus
                                                          or settings.max_gpus)
    store = open_store(settings.database_url)
    try:
        now = datetime.now(UTC)
        if settings.backend == "local":  # its jobs live on the replayed market's clock: its last moment is "now"
            with store.transaction() as s:
                now = s.scalar(select(func.max(JobEventRow.at))) or now
        lines = team_lines(store, fair, now)
    finally:
        store.dispose()
    if as_json:
        print(json.dumps({"capacity_gpus": fair.capacity_gpus, "teams": [line.as_dict() for line in lines]}))
        return
    from rich.table import Table

    from broker.cli.app import console
    from broker.cli.job_output import shown

    table = Table(header_style="bold")
    for column in ("team", "weight", "owed", "held", "borrowed", "queued", "waiting", "usage GPU-h", "budget left",
                   "reclaims given", "taken", "work lost"):
        table.add_column(column, no_wrap=True)
    for line in lines:
        table.add_row(shown(line.team), f"{line.weight:g}", f"{line.owed_gpus:g}", str(line.held_gpus),
                      f"{line.borrowed_gpus:g}", str(line.queued), str(line.waiting), f"{line.usage_gpu_hours:.1f}",
                      "-" if line.budget_left is None else f"${line.budget_left:.2f}", str(line.reclaims_given),
                      str(line.reclaims_taken), f"{line.work_lost_s:.0f} s")
    console.print(table)
    if not settings.teams:
        console.print("no teams named in the settings: every team has weight 1 (see docs/fair-share.md)",
                      highlight=False)
