"""The teams page: each team's share owed, GPUs held and borrowed, waiting jobs, usage, budget left, reclaims."""

from __future__ import annotations

from broker.status.teams import TeamLine
from broker.web.html import e, money, table
from broker.web.session import Viewer
from broker.web.team_chart import TeamSeries, usage_svg


def render(lines: list[TeamLine], viewer: Viewer, capacity: int | None, series: TeamSeries | None = None) -> str:
    """Every team for an admin; a team's own line (and its own line of the chart) for the others (budgets are
    theirs to see)."""
    shown = [line for line in lines if viewer.admin or line.team == viewer.team]
    fleet = f"{capacity} GPUs" if capacity is not None else "no limit (GPUs are never short)"
    rows = [[e(line.team), e(f"{line.weight:g}"), e(f"{line.owed_gpus:g}"), e(line.held_gpus),
             e(f"{line.borrowed_gpus:g}"), e(line.queued), e(line.waiting), e(f"{line.usage_gpu_hours:.1f}"),
             "-" if line.budget_left is None else e(money(line.budget_left)), e(line.reclaims_given),
             e(line.reclaims_taken), e(f"{line.work_lost_s:.0f} s")] for line in shown]
    body = table(["team", "weight", "owed GPUs", "held", "borrowed", "queued", "waiting", "usage GPU-h (decayed)",
                  "budget left", "reclaims given", "taken", "work lost to reclaims"], rows, 'class="teams"')
    return (f"<p>Fleet: {e(fleet)}. A team is owed its weighted part of the GPUs among the teams with work; "
            "it may borrow what others leave unused, and gives it back at a checkpoint when an owner's job "
            "waits.</p>" + (body if shown else "<p>No team has work or a share yet.</p>")
            + ("" if series is None else '<h2>GPUs held over the last 24 hours, against the share owed</h2>'
               + usage_svg(series, sorted(set(series.held) | set(series.owed)) if viewer.admin else [viewer.team])))
