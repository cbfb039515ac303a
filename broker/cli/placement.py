"""``broker simulate-placement``: replay a job trace on a fixed cluster under each placement policy."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Annotated

import typer
from rich import box
from rich.console import Console
from rich.table import Table

from broker.cli.app import JsonOption, UsageError, app, console, err_console

_CLUSTER = re.compile(r"^\s*(\d+)\s*[xX]\s*(\S+)\s*$")


MAX_CLUSTER_NODES = 10_000


def parse_cluster(text: str) -> tuple[int, str]:
    """``8xp3.16xlarge`` -> (8, "p3.16xlarge"); UsageError naming --cluster otherwise."""
    from providers.topology import UnknownInstanceType, topology

    m = _CLUSTER.match(text[:200])
    if not m or int(m.group(1)) < 1:
        raise UsageError(f"--cluster must look like NODESxINSTANCE_TYPE (e.g. 8xp3.16xlarge), got {text[:80]!r}")
    if int(m.group(1)) > MAX_CLUSTER_NODES:  # the replay keeps every node's GPUs
        raise UsageError(f"--cluster: at most {MAX_CLUSTER_NODES} nodes, got {m.group(1)[:20]}")
    try:
        topology(m.group(2))
    except UnknownInstanceType as exc:
        raise UsageError(f"--cluster: {exc}") from None
    return int(m.group(1)), m.group(2)


WorkloadOption = Annotated[Path, typer.Option("--workload", help="job trace CSV: job_id,num_gpus,submit_time,"
                                                                   "duration,model; with --nodes, a pod list "
                                                                   "(name,cpu_milli,memory_mib,num_gpu,gpu_milli"
                                                                   "[,gpu_spec])")]
ClusterOption = Annotated[str | None, typer.Option("--cluster", help="fixed cluster, NODESxINSTANCE_TYPE, "
                                                                     "e.g. 8xp3.16xlarge")]
NodesOption = Annotated[Path | None, typer.Option("--nodes", help="GPU-sharing replay: node list CSV "
                                                                  "(sn,cpu_milli,memory_mib,gpu,model)")]
UntilOption = Annotated[float, typer.Option("--until", help="with --nodes: stop when the GPU requested reaches "
                                                            "this multiple of the cluster's GPU capacity")]
PlotOption = Annotated[Path | None, typer.Option("--plot", help="with --nodes: draw the curves to this PNG")]
PolicyOption = Annotated[str | None, typer.Option("--policy", help="placement policies, comma-separated "
                                                                  "(default: all)")]
ProfilesOption = Annotated[Path | None, typer.Option("--profiles", help="directory of measured placement profiles "
                                                     "(<model>_placements-<set>.csv); default: the bandwidth model")]
ProfileSetOption = Annotated[str, typer.Option("--profile-set", help="which profiles in --profiles: dgx or azure")]
SeedOption = Annotated[int, typer.Option("--seed", help="seed of the random policy")]


@app.command("simulate-placement")
def simulate_placement(workload: WorkloadOption, cluster: ClusterOption = None, nodes_csv: NodesOption = None,
                       policy: PolicyOption = None, profiles: ProfilesOption = None,
                       profile_set: ProfileSetOption = "dgx", seed: SeedOption = 0, until: UntilOption = 1.3,
                       plot: PlotOption = None, as_json: JsonOption = False) -> None:
    """Replay a job trace on a fixed cluster and compare placement policies.

    With --cluster: a Philly-style gang trace on NODESxINSTANCE_TYPE. With --nodes: FGD's
    inflation experiment on an Alibaba GPU-sharing pod list (fractions of GPUs).
    """
    if nodes_csv is not None:
        if cluster is not None or profiles is not None:
            raise UsageError("--nodes replays a pod list on a node list; it takes neither --cluster nor --profiles")
        _simulate_sharing(workload, nodes_csv, policy, seed, until, plot, as_json)
        return
    if cluster is None:
        raise UsageError("--cluster (a Philly-style job trace) or --nodes (an Alibaba pod list) is required")
    if plot is not None or until != 1.3:
        raise UsageError("--plot and --until go with --nodes")
    from broker.sim.placement import PlacementResult, simulate
    from broker.sim.speed import BandwidthSpeed, ProfileSpeed, SpeedModel, profile_model
    from broker.sim.workload import WorkloadError, read_workload
    from policies import kinds
    from policies.placement import ClusterSnapshot

    nodes, instance_type = parse_cluster(cluster)
    if not 0 <= seed < 2**32:
        raise UsageError(f"--seed must be between 0 and {2**32 - 1}, got {seed}")
    known = kinds.placement.names()
    default = kinds.placement.default_name()
    names = ([p.strip() for p in policy.split(",") if p.strip()] if policy
             else sorted(known, key=lambda n: (n != default, n)))
    unknown = [n for n in names if n not in known]
    if unknown or not names:
        raise UsageError(f"--policy: unknown placement policy {', '.join(unknown) or '(none)'}; "
                         f"registered: {', '.join(known)}")
    try:
        jobs = read_workload(workload)
        speed: SpeedModel = ProfileSpeed.load(profiles, profile_set) if profiles else BandwidthSpeed()
        for job in jobs:
            profile_model(job.model)
    except WorkloadError as exc:
        raise UsageError(str(exc)) from None
    snapshot = ClusterSnapshot.empty(f"{nodes}x{instance_type}", instance_type, nodes)
    results: list[PlacementResult] = []
    try:
        for name in names:
            results.append(simulate(jobs, snapshot, name, kinds.placement.get(name), speed, seed=seed))
    except WorkloadError as exc:
        raise UsageError(str(exc)) from None
    if as_json:
        console.print_json(json.dumps({r.policy: r.to_json() for r in results}))
        return
    skipped = results[0].skipped_jobs
    table = Table(title=f"{len(jobs)} jobs on {nodes} x {instance_type} ({snapshot.total_gpus} GPUs), "
                        f"speed from the {speed.name}; times in hours", box=box.SIMPLE, pad_edge=False)
    for col in ("policy", "avg JCT", "p95 JCT", "makespan", "util", "strand", "splits", "avoid", "slow", "ms"):
        table.add_column(col, justify="left" if col == "policy" else "right", no_wrap=True)
    for r in results:
        table.add_row(r.policy, f"{r.avg_jct_s / 3600:.2f}", f"{r.p95_jct_s / 3600:.2f}", f"{r.makespan_s / 3600:.2f}",
                      f"{r.utilization:.1%}", f"{r.stranded_gpus:.2f}", str(r.splits), str(r.avoidable_splits),
                      f"{r.mean_slowdown:.3f}", f"{r.decision_ms_median:.3f}")
    # Wider than the 80 columns rich assumes off a terminal, so piped output keeps every figure.
    Console(width=max(console.width, 110)).print(table)
    console.print("util: GPU-time held / cluster GPU-time; strand: mean free GPUs on partly used nodes while "
                  "jobs wait; splits / avoid: gangs over several nodes / over more nodes than needed; "
                  "slow: mean slowdown vs ideal placement; ms: median placement decision", soft_wrap=True)
    if skipped:
        err_console.print(f"skipped {skipped} job(s) needing more than the cluster's {snapshot.total_gpus} GPUs")


def _simulate_sharing(workload: Path, nodes_csv: Path, policy: str | None, seed: int, until: float,
                      plot: Path | None, as_json: bool) -> None:
    import math

    from broker.sim.sharing import ClusterTraceError, inflate, read_nodes, read_pods, replay
    from broker.sim.sharing import plot as draw
    from policies import kinds

    if not math.isfinite(until) or not 0.1 <= until <= 5:
        raise UsageError(f"--until must be between 0.1 and 5 (times the cluster's GPU capacity), got {until}")
    if not 0 <= seed < 2**32:
        raise UsageError(f"--seed must be between 0 and {2**32 - 1}, got {seed}")
    if plot is not None and plot.suffix.lower() != ".png":
        raise UsageError(f"--plot must name a .png file, got {str(plot)!r}")
    known = kinds.sharing.names()
    default = kinds.sharing.default_name() or known[0]
    names = ([p.strip() for p in policy.split(",") if p.strip()] if policy
             else sorted(known, key=lambda n: (n != default, n)))
    unknown = [n for n in names if n not in known]
    if unknown or not names:
        raise UsageError(f"--policy: unknown sharing policy {', '.join(unknown) or '(none)'}; "
                         f"registered: {', '.join(known)}")
    names = list(dict.fromkeys(names))
    try:
        nodes = read_nodes(nodes_csv)
        capacity = 1000 * sum(n.gpus for n in nodes)
        if capacity <= 0:
            raise ClusterTraceError(f"{nodes_csv}: no node has a GPU")
        pods = read_pods(workload, nodes)
        tasks = inflate(pods, capacity, until, seed)
    except ClusterTraceError as exc:
        raise UsageError(str(exc)) from None
    results = [replay(tasks, nodes, name, kinds.sharing.get(name), seed=seed, until=until) for name in names]
    if plot is not None:
        try:
            draw(results, plot, f"{len(tasks)} tasks on {len(nodes)} nodes ({capacity // 1000} GPUs)")
        except OSError as exc:
            raise UsageError(f"--plot: cannot write {plot}: {exc.strerror or exc}") from None
    if as_json:
        console.print_json(json.dumps({"default_policy": default,
                                       "policies": {r.policy: r.to_json() for r in results}}))
        return
    table = Table(title=f"{len(tasks)} tasks from {len(pods)} pods on {len(nodes)} nodes ({capacity // 1000} GPUs), "
                        f"arriving until {until:g} x GPU capacity; unallocated GPU % of capacity",
                  box=box.SIMPLE, pad_edge=False)
    marks = [p.arrived_pct for p in results[0].curve]
    shown = [m for m in marks if m >= 70]
    for col in ("policy", *(f"@{m}%" for m in shown), "end", "allocated", "failed", "ms p50"):
        table.add_column(col, justify="left" if col == "policy" else "right", no_wrap=True)
    for r in results:
        table.add_row(r.policy, *(f"{r.at(m):.2f}" for m in shown), f"{r.unallocated_gpu_pct:.2f}",
                      f"{r.allocated_gpu_pct:.2f}", str(r.failed_tasks), f"{r.decision_ms_p50:.3f}")
    Console(width=max(console.width, 120)).print(table)
    console.print("@N%: GPU capacity left unallocated when N % of it has arrived (requested); end: after the last "
                  "task; failed: tasks refused; ms p50: median placement decision", soft_wrap=True)
    if plot is not None:
        console.print(f"plot written to {plot}")


@app.command("show-topology")
def show_topology(
    instance_type: Annotated[str, typer.Argument(help="e.g. p3.16xlarge, p4d.24xlarge, a3-highgpu-8g")],
    as_json: JsonOption = False,
) -> None:
    """Print how the GPUs of an instance type are linked, its network and its placement level."""
    from providers.topology import UnknownInstanceType, topology

    try:
        topo = topology(instance_type)
    except UnknownInstanceType as exc:
        raise UsageError(str(exc)) from None
    if as_json:
        console.print_json(json.dumps({
            "instance_type": topo.instance_type, "cloud": topo.cloud, "gpus": topo.gpus,
            "link_kind": topo.link_kind, "link_gb_s": topo.link_gb_s, "network_gbit_s": topo.network_gbit_s,
            "network_kind": topo.network_kind, "placement_level": topo.placement_level,
        }))
        return
    table = Table(title=f"{topo.cloud} {topo.instance_type}: GPU-to-GPU link, GB/s per direction")
    table.add_column("")
    for j in range(topo.gpus):
        table.add_column(f"GPU{j}", justify="right")
    for i in range(topo.gpus):
        table.add_row(f"GPU{i}", *("X" if i == j else f"{topo.link_kind[i][j]} {topo.link_gb_s[i][j]:g}"
                                   for j in range(topo.gpus)))
    console.print(table)
    console.print(f"network: {topo.network_gbit_s:g} Gbit/s {topo.network_kind}; "
                  f"placement level: {topo.placement_level or 'none'}")
