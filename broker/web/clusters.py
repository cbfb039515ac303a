"""Clusters: each live cluster's nodes and GPUs, drawn in NVLink groups, with the job holding each GPU."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from sqlalchemy import func, select

from broker.model import LIVE_CLUSTER_STATES, JobState
from broker.store import Store
from broker.store.rollup import LedgerRollupRow
from broker.store.tables import AllocationRow, ClusterRow, JobRow
from broker.web.html import e, money
from broker.web.session import Viewer
from broker.web.times import Times
from providers.topology import NVLINK, NVSWITCH, UnknownInstanceType, generic_topology, topology

MAX_CLUSTERS = 200


def nvlink_groups(cloud: str, instance_type: str, gpus: int) -> list[list[int]]:
    """GPUs of one node split into groups whose every pair talks over NVLink (one GPU each when none do)."""
    try:
        topo = topology(instance_type)
    except UnknownInstanceType:
        topo = generic_topology(cloud, instance_type, gpus)
    if topo.gpus != gpus:
        topo = generic_topology(cloud, instance_type, gpus)
    groups: list[list[int]] = []
    for gpu in range(gpus):
        for group in groups:
            if all(topo.link(gpu, other)[0] in (NVLINK, NVSWITCH) for other in group):
                group.append(gpu)
                break
        else:
            groups.append([gpu])
    return groups


@dataclass
class ClusterView:
    cluster: ClusterRow
    # (node, gpu) -> (job id or None when another team's, job state)
    holders: dict[tuple[int, int], tuple[str | None, str]] = field(default_factory=dict)
    team: str | None = None  # the team of the job it was launched for (None: a pool's, or another team's)
    teams: set[str] = field(default_factory=set)  # teams of the jobs holding its GPUs, as far as the viewer may see
    cost: float = 0.0  # the ledger's cost of the cluster so far (every holder and idle time)


def load_clusters(store: Store, viewer: Viewer) -> list[ClusterView]:
    with store.transaction() as s:
        clusters = list(s.scalars(select(ClusterRow).where(ClusterRow.state.in_(LIVE_CLUSTER_STATES))
                                  .order_by(ClusterRow.created_at).limit(MAX_CLUSTERS)))
        ids = [c.id for c in clusters]
        rows: list[Any] = list(s.execute(
            select(AllocationRow.cluster_id, AllocationRow.gpus, JobRow.id, JobRow.team, JobRow.state)
            .join(JobRow, JobRow.id == AllocationRow.job_id)
            .where(AllocationRow.cluster_id.in_(ids), AllocationRow.ended_at.is_(None)))) if ids else []
        owners = dict(s.execute(select(JobRow.id, JobRow.team).where(
            JobRow.id.in_([c.job_id for c in clusters if c.job_id]))).all()) if ids else {}
        # The hourly roll-up: the ledger's sums per cluster, a sixtieth of its rows or fewer.
        costs = dict(s.execute(select(LedgerRollupRow.cluster_id, func.sum(LedgerRollupRow.cost))
                               .where(LedgerRollupRow.cluster_id.in_(ids))
                               .group_by(LedgerRollupRow.cluster_id)).all()) if ids else {}
        s.expunge_all()
    views = {c.id: ClusterView(c, team=owners.get(c.job_id or ""), cost=float(costs.get(c.id) or 0.0))
             for c in clusters}
    for cluster_id, gpus, job_id, team, state in rows:
        visible = viewer.scope is None or team == viewer.scope
        if visible:
            views[cluster_id].teams.add(team)
        for node, indices in (gpus or {}).items():
            for gpu in indices:
                views[cluster_id].holders[(int(node), int(gpu))] = (job_id if visible else None, state)
    mine = [v for v in views.values() if viewer.scope is None or owners.get(v.cluster.job_id or "") == viewer.scope
            or any(job is not None for job, _ in v.holders.values())]
    return mine


def _gpu(view: ClusterView, node: int, gpu: int) -> str:
    holder = view.holders.get((node, gpu))
    if holder is None:
        return f'<span class="gpu free" title="GPU {gpu}: free">{gpu}</span>'
    job_id, state = holder
    kind = "held" if state == JobState.RUNNING.value else "idle"
    who = f"job {job_id}" if job_id else "another team's job"
    label = f'<a href="/jobs/{e(job_id)}" style="color:inherit">{gpu}</a>' if job_id else str(gpu)
    return (f'<span class="gpu {kind}" title="GPU {gpu}: {e(who)} ({e(state)})" data-job="{e(job_id or "")}">'
            f'{label}</span>')


def summary_table(views: list[ClusterView], now: datetime, times: Times) -> str:
    """One row per live cluster: what an operator scans first (where, who, how long, what it cost so far)."""
    rows = []
    for view in views:
        c = view.cluster
        teams = sorted(view.teams | ({view.team} if view.team else set()))
        up = times.span((now - c.up_at).total_seconds()) if c.up_at else "not up yet"
        rows.append(f'<tr data-cluster-row="{e(c.id)}"><td><a href="#cluster-{e(c.id)}">{e(c.id)}</a></td>'
                    f'<td>{e(c.state)}</td><td>{e(c.cloud)}/{e(c.zone)}</td><td>{e(c.instance_type)}</td>'
                    f'<td>{c.num_nodes} × {c.gpus_per_node} {e(c.accelerator or "GPU")}</td>'
                    f'<td>{"spot" if c.spot else "on-demand"}</td><td>{e(", ".join(teams) or "-")}</td>'
                    f'<td data-uptime>{e(up)}</td><td>{e(money(c.price_per_node_hour * c.num_nodes))}/h</td>'
                    f'<td data-cost>{e(money(view.cost))}</td></tr>')
    head = "".join(f"<th>{h}</th>" for h in ("cluster", "state", "where", "instance", "GPUs", "market", "team",
                                              "uptime", "price", "cost so far"))
    return f'<table class="clusters"><thead><tr>{head}</tr></thead><tbody>{"".join(rows)}</tbody></table>'


def render(views: list[ClusterView], now: datetime, times: Times) -> str:
    legend = ('<p><span class="gpu held">n</span> held by a running job <span class="gpu idle">n</span> held, '
              'job not running (idle) <span class="gpu free">n</span> free; a blue frame is one NVLink group.</p>')
    if not views:
        return legend + '<p class="empty">No live clusters.</p>'
    parts = [summary_table(views, now, times), legend]
    for view in views:
        c = view.cluster
        groups = nvlink_groups(c.cloud, c.instance_type, c.gpus_per_node)
        nodes = []
        for node in range(c.num_nodes):
            drawn = "".join(
                (f'<span class="nvgroup">{"".join(_gpu(view, node, g) for g in group)}</span>' if len(group) > 1
                 else _gpu(view, node, group[0])) for group in groups)
            nodes.append(f'<div class="node"><div>node {node}</div>{drawn}</div>')
        jobs = sorted({j for j, _ in view.holders.values() if j})
        held = ", ".join(f'<a href="/jobs/{e(j)}">{e(j)}</a>' for j in jobs) or "none"
        parts.append(f'<section class="cluster" id="cluster-{e(c.id)}" data-cluster="{e(c.id)}">'
                     f'<h3>{e(c.id)} · {e(c.state)}</h3>'
                     f'<p>{e(c.cloud)}/{e(c.zone)} · {c.num_nodes} × {e(c.instance_type)} '
                     f'({c.gpus_per_node} {e(c.accelerator or "GPU")} each) · '
                     f'{"spot" if c.spot else "on-demand"} ${c.price_per_node_hour:,.2f}/node-h · jobs: {held}</p>'
                     f'{"".join(nodes)}</section>')
    return "".join(parts)
