"""Clusters: each live cluster's nodes and GPUs, drawn in NVLink groups, with the job holding each GPU."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import select

from broker.engine import LIVE_CLUSTER_STATES
from broker.model import JobState
from broker.store import Store
from broker.store.tables import AllocationRow, ClusterRow, JobRow
from broker.web.html import e
from broker.web.session import Viewer
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
        s.expunge_all()
    views = {c.id: ClusterView(c) for c in clusters}
    for cluster_id, gpus, job_id, team, state in rows:
        visible = viewer.scope is None or team == viewer.scope
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


def render(views: list[ClusterView]) -> str:
    legend = ('<p><span class="gpu held">n</span> held by a running job <span class="gpu idle">n</span> held, '
              'job not running (idle) <span class="gpu free">n</span> free; a blue frame is one NVLink group.</p>')
    if not views:
        return legend + '<p class="empty">No live clusters.</p>'
    parts = [legend]
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
        parts.append(f'<section class="cluster" data-cluster="{e(c.id)}"><h3>{e(c.id)} · {e(c.state)}</h3>'
                     f'<p>{e(c.cloud)}/{e(c.zone)} · {c.num_nodes} × {e(c.instance_type)} '
                     f'({c.gpus_per_node} {e(c.accelerator or "GPU")} each) · '
                     f'{"spot" if c.spot else "on-demand"} ${c.price_per_node_hour:,.2f}/node-h · jobs: {held}</p>'
                     f'{"".join(nodes)}</section>')
    return "".join(parts)
