"""``broker launch JOB --backend skypilot --dryrun [--json]``: the plan, the SkyPilot task, SkyPilot's dry run.

Nothing is launched and no job is written (only a price refresh, into the price book): the plan
comes from the selection policy over the engine's own market (``broker.market.price_market``), the task
is the one the first launchable offer would get, and SkyPilot's own dry run
(``sky.launch(..., dryrun=True)`` through its API server) shows what it would provision. Offline,
SkyPilot's dry run cannot fetch its catalog: one line says so and the plan still stands.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import math
import threading
from typing import TYPE_CHECKING, Any

import yaml
from rich.table import Table

from broker.backends.base import ClusterInfo
from broker.backends.skypilot.runtime import dryrun_task
from broker.cli.app import UsageError, console, err_console
from broker.cli.sky_output import captured, clean_output, ranked_offers, zone_history
from broker.clock import WallClock
from broker.config.settings import Settings
from broker.engine.parts import CLOUD_RESTART_OVERHEAD_S, restart_overhead
from broker.engine.planning import fitting, offer_of, preview_request
from broker.market.sky_catalog import SkyCatalogMarket
from broker.spec.job import JobSpec
from policies import kinds
from policies.selection import IDLE, ON_DEMAND, Location, Plan, ZoneRecord
from providers.base import SpotQuote

if TYPE_CHECKING:
    from broker.market.book import Market

DRYRUN_TIMEOUT_SECONDS = 600.0
MAX_HISTORIES = 200  # offers whose last day of quotes the plan shows


def preview_plan(spec: JobSpec, quotes: list[SpotQuote], policy: str | None,
                 restart_overhead_s: float = CLOUD_RESTART_OVERHEAD_S,
                 record: dict[str, ZoneRecord] | None = None, past: Market | None = None) -> Plan:
    """The plan the engine would make for ``spec`` if it were submitted now (the engine's own request
    builder), with the broker's record of preemptions and failed launches per zone, and the recent
    past of each offer when ``past`` keeps one (the price book)."""
    request = preview_request(spec, quotes, WallClock().now(), restart_overhead_s, past)
    return kinds.selection.get(policy, live=True)(dataclasses.replace(request, record=record or {}))


TABLE_ROWS = 20


class _TaskDumper(yaml.SafeDumper):
    """Multi-line commands as literal blocks, as they are written in a task file."""


def _text(dumper: yaml.SafeDumper, value: str) -> yaml.Node:
    style = "|" if "\n" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_TaskDumper.add_representer(str, _text)


def task_yaml(config: dict[str, Any]) -> str:
    return yaml.dump(config, Dumper=_TaskDumper, sort_keys=False, width=1000).rstrip()


def _plan_table(ranked: list[dict[str, Any]], reason: str) -> Table:
    """The plan's first ``TABLE_ROWS`` offers (a CPU task fits a thousand zone x type offers; --json has all)."""
    more = len(ranked) - TABLE_ROWS
    table = Table(title=f"plan: {reason}", header_style="bold", title_justify="left",
                  caption=f"... and {more} more offers, in order (all of them with --json)" if more > 0 else None,
                  caption_justify="left")
    for column in ("#", "kind", "where", "instance", "$/node-h", "$/h gang", "quote age", "source"):
        table.add_column(column)
    for row in ranked[:TABLE_ROWS]:
        if row["cloud"] is None:
            table.add_row(str(row["rank"]), row["kind"], *["-"] * 6)
            continue
        age = "-" if row["quote_age_s"] is None else f"{row['quote_age_s'] / 60:.0f} min"
        table.add_row(str(row["rank"]), row["kind"], f"{row['cloud']}/{row['zone']}", row["instance_type"],
                      f"{row['price_per_node_hour']:.4f}", f"{row['price_per_hour']:.2f}",
                      age + (" (stale)" if row["stale"] else ""), row["source"])
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


def _offline(exc: BaseException, said: str) -> bool:
    """SkyPilot could not reach its catalog or its API server (no network), rather than refusing the task."""
    seen: BaseException | None = exc
    while seen is not None:
        name = type(seen).__name__
        if isinstance(seen, OSError | TimeoutError) or "Connection" in name or "Timeout" in name:
            return True
        if type(seen).__name__ == "CloudError" and "ConnectionError" in str(seen):
            return True  # SkyPilot's catalog download, its requests error wrapped
        seen = seen.__cause__ or seen.__context__
    return "Failed to fetch" in said or "internet connection" in said


def _one_line(exc: BaseException) -> str:
    first = clean_output(str(exc)).strip().splitlines()
    text = f"{type(exc).__name__}: {first[0]}" if first else type(exc).__name__
    return text if len(text) <= 200 else text[:197] + "..."


def dryrun(settings: Settings, spec: JobSpec, catalog: Any = None, as_json: bool = False,
           sdk_dryrun: Any = None) -> bool:
    """Print the plan (and the task, and SkyPilot's own dry run); False only when SkyPilot refused it.

    The plan is the engine's over the same market: the price book (refreshed first when its newest
    quote for the job's accelerators is older than ``price_max_age_seconds``), with SkyPilot's
    catalog for offers it never quoted. Whatever SkyPilot prints goes through ``captured``, so its
    payload markup and tracebacks never reach the terminal; with ``as_json`` stdout holds one object.
    """
    from broker.market.book import PriceBook
    from broker.market.polling import refresh_if_old
    from broker.market.price_market import PriceBookMarket
    from broker.store import open_store

    names = [a.name for a in spec.accelerators]
    store = open_store(settings.database_url)
    try:
        book = PriceBook(store)
        with captured():
            polls = refresh_if_old(book, settings, names)
        market = PriceBookMarket(book, SkyCatalogMarket(lambda: names, catalog=catalog), settings.price_stale_seconds,
                                 wanted=lambda: names)
        now = WallClock().now()
        with captured():
            offers = market.offers(now)
        records = zone_history(store)
        plan = preview_plan(spec, [o.quote for o in offers], settings.selection_policy, restart_overhead(settings),
                            records, market)
        fit, _ = fitting(spec, [o.quote for o in offers])
        history = {q.key: market.history(q.key, now) for q in fit[:MAX_HISTORIES]}
    finally:
        store.dispose()
    notes = [p.line for p in polls or []]  # what the cloud SDKs printed meanwhile (polled, read) is dropped
    every = Plan(tuple(Location("spot", offer_of(q)) for q in sorted(fit, key=lambda q: q.spot_price or math.inf)),
                 reason="every offer the job fits, cheapest spot first")
    # A plan to wait still shows the task its first offer would get once the policy goes.
    cluster = first_cluster(spec, plan) or first_cluster(spec, every)
    if cluster is None:
        wanted = ", ".join(f"{a.name}:{a.count}" for a in spec.accelerators) or "any"
        raise UsageError(f"resources.accelerators: no offer in the price book or SkyPilot's catalog for {wanted} "
                         f"per node on {', '.join(sorted(spec.allowed_clouds)) or 'aws, gcp, azure'}")
    name, config = dryrun_task(spec, cluster, settings)
    with captured() as sky_said:
        try:
            (sdk_dryrun or sky_dryrun)(name, config)
            outcome, refused = "ok", False
        except Exception as exc:
            offline = _offline(exc, sky_said.text)
            outcome, refused = ("offline: " if offline else "refused: ") + _one_line(exc), not offline
    ranked = ranked_offers(plan, spec.num_nodes, offers, records, now, history)
    market_rows = ranked_offers(every, spec.num_nodes, offers, records, now, history)
    if as_json:
        print(json.dumps({"job": spec.name, "nodes": spec.num_nodes, "plan": plan.reason, "offers": ranked,
                          "market": market_rows,
                          "refreshed": notes, "skypilot_dry_run": outcome}, indent=2))
        return not refused
    for line in notes:
        err_console.print(line, highlight=False, markup=False)
    console.print(_plan_table(ranked, plan.reason))
    if not plan.locations:
        console.print(_plan_table(market_rows[:10], every.reason))
    console.print(f"\n[bold]SkyPilot task for {name}[/bold] (offer 1; the job's run starts later with sky exec)")
    print(task_yaml(config))
    console.print("\n[bold]SkyPilot dry run[/bold]")
    if outcome == "ok":
        print("\n".join(sky_said.lines()))
    elif refused:
        console.print(f"[red]SkyPilot refused the dry run:[/red] {outcome.removeprefix('refused: ')}",
                      highlight=False)
    else:
        console.print("SkyPilot's dry run could not fetch its catalog or reach its API server "
                      f"({outcome.removeprefix('offline: ')}); the plan above is the broker's own", highlight=False)
    return not refused
