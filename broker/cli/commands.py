"""Every command of ``broker``: its name, the module that registers it, its one-line help.

Kept apart from ``broker.cli.app`` (which the command modules import) so that naming the modules
here binds no cycle; ``broker.cli`` hands the table to the root group.
"""

from __future__ import annotations

# Command name -> (module that registers it, the one-line help `broker --help` shows). A module
# registers its commands on ``broker.cli.app.app`` when imported; a command missing here still runs
# (every module is imported to find it) but is not listed. tests/broker/cli/test_startup.py checks the
# help lines against the commands' own docstrings.
COMMANDS: dict[str, tuple[str, str]] = {
    "launch": ("broker.cli.jobs", "Validate a job file, run it on the cheapest spot capacity, and follow it to "
                                  "the end."),
    "status": ("broker.cli.jobs", "Show one job, or the newest jobs (oldest of them first), with cost, preemptions "
                                  "and where it runs."),
    "cancel": ("broker.cli.jobs", "Cancel a job; its clusters are torn down by the engine's next step."),
    "logs": ("broker.cli.jobs", "Print a job's output, every attempt and node in order."),
    "engine": ("broker.cli.engine", "Run the engine in the foreground until no job is active; Ctrl-C stops it, and "
                                    "its jobs wait for the next."),
    "prices": ("broker.cli.prices", "Spot and on-demand GPU prices, cheapest per GPU-hour first."),
    "simulate": ("broker.cli.simulate", "Compare selection policies on a job over a recorded market: cost, "
                                        "preemptions, deadlines."),
    "simulate-placement": ("broker.cli.placement", "Replay a job trace on a fixed cluster and compare placement "
                                                   "policies."),
    "simulate-fairshare": ("broker.cli.fair_share", "Replay a multi-team job trace on a fleet under fair share, "
                                                    "FIFO and static quotas; shares, waits, reclaims."),
    "show-topology": ("broker.cli.placement", "Print how the GPUs of an instance type are linked, its network and its "
                                              "placement level."),
    "report": ("broker.cli.report", "Spend, on-demand equivalent, savings, preemptions and idle GPU-hours by job, "
                                    "team, cloud, region, GPU."),
    "serve": ("broker.cli.serve", "Run the broker as a service; start one per machine on a shared PostgreSQL for "
                                  "high availability."),
    "dashboard": ("broker.cli.dashboard", "Open the dashboard on this machine's store; prints a sign-in token that "
                                          "is revoked when it stops."),
    "teams": ("broker.cli.teams", "Each team's share owed and GPUs held now, borrowed, waiting jobs, recent usage, "
                                  "budget left, reclaims."),
    "token": ("broker.cli.tokens", "API tokens for teams (the service's `Authorization: Bearer` tokens)."),
    "run-engine": ("broker.cli.engine", ""),
}
HIDDEN = frozenset({"run-engine"})
