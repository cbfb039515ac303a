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


def parse_cluster(text: str) -> tuple[int, str]:
    """``8xp3.16xlarge`` -> (8, "p3.16xlarge"); UsageError naming --cluster otherwise."""
    from providers.topology import UnknownInstanceType, topology

    m = _CLUSTER.match(text)
    if not m or int(m.group(1)) < 1:
        raise UsageError(f"--cluster must look like NODESxINSTANCE_TYPE (e.g. 8xp3.16xlarge), got {text!r}")
    try:
        topology(m.group(2))
    except UnknownInstanceType as exc:
        raise UsageError(f"--cluster: {exc}") from None
    return int(m.group(1)), m.group(2)


WorkloadOption = Annotated[Path, typer.Option("--workload", help="job trace CSV: job_id,num_gpus,submit_time,"
                                                                   "duration,model")]
ClusterOption = Annotated[str, typer.Option("--cluster", help="fixed cluster, NODESxINSTANCE_TYPE, e.g. 8xp3.16xlarge")]
PolicyOption = Annotated[str | None, typer.Option("--policy", help="placement policies, comma-separated "
                                                                  "(default: all)")]
ProfilesOption = Annotated[Path | None, typer.Option("--profiles", help="directory of measured placement profiles "
                                                     "(<model>_placements-<set>.csv); default: the bandwidth model")]
ProfileSetOption = Annotated[str, typer.Option("--profile-set", help="which profiles in --profiles: dgx or azure")]
SeedOption = Annotated[int, typer.Option("--seed", help="seed of the random policy")]


@app.command("simulate-placement")
def simulate_placement(workload: WorkloadOption, cluster: ClusterOption, policy: PolicyOption = None,
                       profiles: ProfilesOption = None, profile_set: ProfileSetOption = "dgx", seed: SeedOption = 0,
                       as_json: JsonOption = False) -> None:
    """Replay a Philly-style job trace on a fixed cluster and compare placement policies."""
    from broker.sim.placement import PlacementResult, simulate
    from broker.sim.speed import BandwidthSpeed, ProfileSpeed, SpeedModel, profile_model
    from broker.sim.workload import WorkloadError, read_workload
    from policies import registry
    from policies.placement import ClusterSnapshot

    nodes, instance_type = parse_cluster(cluster)
    known = registry.names("placement")
    default = registry.default_name("placement")
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
            results.append(simulate(jobs, snapshot, name, registry.get("placement", name), speed, seed=seed))
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
