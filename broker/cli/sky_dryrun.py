"""``broker launch JOB --backend skypilot --dryrun``: the plan, the SkyPilot task, and SkyPilot's dry run.

Nothing is written to the store and nothing is launched: the plan comes from the selection
policy over SkyPilot's catalog, the task is the one the first launchable offer would get, and
SkyPilot's own dry run (``sky.launch(..., dryrun=True)`` through its API server) shows what it
would provision.
"""

from __future__ import annotations

import copy
import threading
from typing import Any

import yaml
from rich.table import Table

from broker.cli.app import UsageError, console
from broker.clock import WallClock
from broker.config import Settings
from broker.engine.parts import CLOUD_RESTART_OVERHEAD_S, restart_overhead
from broker.engine.planning import preview_request
from broker.provision.base import ClusterInfo
from broker.provision.sky_market import SkyCatalogMarket
from broker.runtime_skypilot import dryrun_task
from broker.spec import JobSpec
from policies import registry
from policies.selection import IDLE, ON_DEMAND, Plan
from providers.base import SpotQuote

DRYRUN_TIMEOUT_SECONDS = 600.0


def preview_plan(spec: JobSpec, quotes: list[SpotQuote], policy: str | None,
                 restart_overhead_s: float = CLOUD_RESTART_OVERHEAD_S) -> Plan:
    """The plan the engine would make for ``spec`` if it were submitted now (the engine's own request builder)."""
    request = preview_request(spec, quotes, WallClock().now(), restart_overhead_s)
    return registry.get("selection", policy, live=True)(request)


class _TaskDumper(yaml.SafeDumper):
    """Multi-line commands as literal blocks, as they are written in a task file."""


def _text(dumper: yaml.SafeDumper, value: str) -> yaml.Node:
    style = "|" if "\n" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_TaskDumper.add_representer(str, _text)


def task_yaml(config: dict[str, Any]) -> str:
    return yaml.dump(config, Dumper=_TaskDumper, sort_keys=False, width=1000).rstrip()


def _plan_table(plan: Plan, nodes: int) -> Table:
    table = Table(title=f"plan: {plan.reason}", header_style="bold", title_justify="left")
    for column in ("#", "kind", "where", "instance", "$/node-h", "$/h gang"):
        table.add_column(column)
    for index, location in enumerate(plan.locations, 1):
        offer = location.offer
        if offer is None:
            table.add_row(str(index), location.kind, "-", "-", "-", "-")
            continue
        price = offer.on_demand_price if location.kind == ON_DEMAND else offer.spot_price
        table.add_row(str(index), location.kind, f"{offer.cloud}/{offer.zone}", offer.instance_type,
                      f"{price:.4f}", f"{price * nodes:.2f}")
    return table


def first_cluster(spec: JobSpec, plan: Plan) -> ClusterInfo | None:
    for location in plan.locations:
        offer = location.offer
        if offer is not None and location.kind != IDLE:
            return ClusterInfo("j-dryrun-c1", offer.cloud, offer.region, offer.zone, offer.instance_type,
                               spec.num_nodes, offer.gpus_per_node, location.kind != ON_DEMAND)
    return None


def sky_dryrun(name: str, config: dict[str, Any], timeout: float = DRYRUN_TIMEOUT_SECONDS) -> None:
    """SkyPilot's own dry run, its output streamed here; raises what SkyPilot raised."""
    outcome: dict[str, BaseException] = {}

    def run() -> None:
        try:
            import sky

            request_id = sky.launch(sky.Task.from_yaml_config(copy.deepcopy(config)), cluster_name=name,
                                    dryrun=True)
            sky.stream_and_get(request_id)
        except BaseException as exc:
            outcome["error"] = exc

    worker = threading.Thread(target=run, name="sky-dryrun", daemon=True)
    worker.start()
    worker.join(timeout)
    if worker.is_alive():
        raise TimeoutError(f"SkyPilot's dry run did not finish within {timeout:.0f}s")
    if "error" in outcome:
        raise outcome["error"]


def dryrun(settings: Settings, spec: JobSpec, catalog: Any = None) -> bool:
    """Print the plan and the task, run SkyPilot's dry run; False when SkyPilot refused it."""
    names = [a.name for a in spec.accelerators]
    market = SkyCatalogMarket(lambda: names, catalog=catalog)
    plan = preview_plan(spec, market.quotes(WallClock().now()), settings.selection_policy,
                        restart_overhead(settings))
    cluster = first_cluster(spec, plan)
    if cluster is None:
        wanted = ", ".join(f"{a.name}:{a.count}" for a in spec.accelerators) or "any"
        raise UsageError(f"resources.accelerators: no offer in SkyPilot's catalog for {wanted} per node "
                         f"on {', '.join(c.cloud for c in spec.broker.clouds) or 'aws, gcp, azure'}")
    console.print(_plan_table(plan, spec.num_nodes))
    name, config = dryrun_task(spec, cluster, settings)
    console.print(f"\n[bold]SkyPilot task for {name}[/bold] (offer 1; the job's run starts later with sky exec)")
    print(task_yaml(config))
    console.print("\n[bold]SkyPilot dry run[/bold]")
    try:
        sky_dryrun(name, config)
    except Exception as exc:
        console.print(f"[red]SkyPilot refused the dry run:[/red] {type(exc).__name__}: {exc}", highlight=False)
        return False
    return True
