"""The largest wastes of a window, each with a one-line suggestion worked out from its own figures."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from broker.model import Usage
from broker.reports.model import CAUSE_LABELS, HELD_IDLE, HELD_IDLE_PARTS, Waste
from broker.reports.sums import IdleSum, ZoneProvisioning


@dataclass(frozen=True, slots=True)
class ClusterFacts:
    cluster_id: str
    cloud: str
    zone: str
    gpu: str
    gpus: int
    team: str | None  # team of the job the cluster was launched for


@dataclass(frozen=True, slots=True)
class JobFacts:
    job_id: str
    name: str
    team: str
    state: str
    preemptions: int
    migrations: int
    work_lost_s: float
    zones: tuple[str, ...]
    gpu_share: float | None = None  # the share of one GPU the job holds (A100:0.5); None: whole GPUs


def top_wastes(provisioning: list[ZoneProvisioning], idle: list[IdleSum], cluster_minutes: dict[str, float],
               clusters: dict[str, ClusterFacts], jobs: dict[str, JobFacts], limit: int = 3) -> list[Waste]:
    """The largest wastes, from the window's idle sums (grouped in the database, ``broker/reports/sums.py``).

    ``cluster_minutes`` holds every GPU-minute in the window of each cluster in ``idle``.
    """
    describe = _Describer(clusters, jobs, cluster_minutes)
    candidates: list[Waste] = describe.provisioning(provisioning)
    for usage in (Usage.RESTARTING.value, Usage.FINISHED.value):
        rows = [i for i in idle if i.usage == usage]
        for key, total in _sum_by(rows, lambda i: i.job_id or f"cluster:{i.cluster_id}").items():
            candidates.append(describe.by_job(usage, key, total))
    held = [i for i in idle if i.usage in HELD_IDLE_PARTS and i.job_id]
    for job_id in sorted({i.job_id for i in held if i.job_id}):
        mine = [i for i in held if i.job_id == job_id]
        parts = {HELD_IDLE_PARTS[u]: t for u, t in _sum_by(mine, lambda i: i.usage).items()}
        candidates.append(describe.held_idle(job_id, _sum_by(mine, lambda _: "all")["all"], parts))
    by_job = {Usage.RESTARTING.value, Usage.FINISHED.value, *HELD_IDLE_PARTS}
    for usage in sorted({i.usage for i in idle} - by_job):
        rows = [i for i in idle if i.usage == usage]
        for cluster_id, total in _sum_by(rows, lambda i: i.cluster_id).items():
            candidates.append(describe.by_cluster(usage, cluster_id, total))
    candidates = [w for w in candidates if w.cost > 0 or w.gpu_hours > 0]
    return sorted(candidates, key=lambda w: (-w.cost, -w.gpu_hours, w.where))[:limit]


@dataclass
class _Sum:
    gpu_minutes: float = 0.0
    cost: float = 0.0
    minutes: float = 0.0  # the rows' seconds over 60 (not their count: minutes split where holders change)


def _sum_by(rows: Iterable[IdleSum], key: Callable[[IdleSum], str]) -> dict[str, _Sum]:
    sums: dict[str, _Sum] = defaultdict(_Sum)
    for row in rows:
        total = sums[key(row)]
        total.gpu_minutes += row.gpu_minutes
        total.cost += row.cost
        total.minutes += row.minutes
    return sums


class _Describer:
    def __init__(self, clusters: dict[str, ClusterFacts], jobs: dict[str, JobFacts],
                 cluster_minutes: dict[str, float]) -> None:
        self.clusters, self.jobs, self.cluster_minutes = clusters, jobs, cluster_minutes

    def cluster_gpus(self, cluster_id: str) -> int:
        cluster = self.clusters.get(cluster_id)
        return cluster.gpus if cluster and cluster.gpus > 0 else 1

    def cluster_name(self, cluster_id: str) -> str:
        cluster = self.clusters.get(cluster_id)
        if cluster is None:
            return f"cluster {cluster_id}"
        return f"cluster {cluster_id} ({cluster.cloud} {cluster.zone}, {cluster.gpus}×{cluster.gpu})"

    def provisioning(self, zones: list[ZoneProvisioning]) -> list[Waste]:
        """Per zone: how long its clusters took to come up, against the other zones of the window."""
        all_up, all_clusters = sum(z.minutes_up for z in zones), sum(z.clusters for z in zones)
        wastes = []
        for z in zones:
            avg = z.minutes_up / z.clusters
            others = all_clusters - z.clusters
            elsewhere = (all_up - z.minutes_up) / others if others else 0.0
            gpu_hours, cost = z.gpu_minutes / 60, z.cost
            if others and slower(avg, elsewhere):
                advice = (f"clusters there took {minutes(avg)} to come up vs {minutes(elsewhere)} "
                          f"elsewhere: prefer faster zones when prices are close")
            else:
                advice = (f"{z.clusters} launch(es) took {minutes(avg)} each to come up: place queued jobs on "
                          f"running clusters instead of launching new ones")
            wastes.append(Waste("provisioning", f"zone {z.zone}", gpu_hours, cost,
                                f"Provisioning in {z.zone} cost ${cost:,.2f} ({gpu_hours:.1f} GPU-h); {advice}."))
        return wastes

    def by_job(self, usage: str, key: str, total: _Sum) -> Waste:
        gpu_hours = total.gpu_minutes / 60
        if key.startswith("cluster:"):
            return self.by_cluster(usage, key.removeprefix("cluster:"), total)
        job = self.jobs.get(key)
        where = f"job {key}" + (f" {job.name} (team {job.team})" if job else "")
        if usage == Usage.RESTARTING.value:
            if job and job.preemptions:
                zones = ", ".join(job.zones[-3:]) or "its zones"
                advice = (f"{job.preemptions} preemption(s) cost {gpu_hours / job.preemptions:.1f} GPU-h of "
                          f"checkpoint and restart each and {job.work_lost_s / 3600:.1f} h of lost work: "
                          f"checkpoint more often or weight {zones} down in selection")
            else:
                advice = "restarts without a preemption: check why its checkpoint restore is slow"
            line = (f"{_upper_first(where)} spent {gpu_hours:.1f} GPU-h (${total.cost:,.2f}) checkpointing and "
                    f"restarting; ")
        else:
            held = total.gpu_minutes / total.minutes if total.minutes else 0.0
            advice = f"it held {held:.0f} GPU(s) for {total.minutes:.0f} min after it ended: release GPUs as a job ends"
            line = f"{_upper_first(where)} cost ${total.cost:,.2f} ({gpu_hours:.1f} GPU-h) after finishing; "
        return Waste(usage, where, gpu_hours, total.cost, line + advice + ".")

    def held_idle(self, job_id: str, total: _Sum, parts: dict[str, _Sum]) -> Waste:
        """A running job whose GPUs were measured idle: for how long, what it cost, and why where known."""
        gpu_hours = total.gpu_minutes / 60
        job = self.jobs.get(job_id)
        where = f"job {job_id}" + (f" {job.name} (team {job.team})" if job else "")
        order = [name for name in ("startup", "checkpoint", "stalled") if name in parts]
        split = ", ".join(f"{name} {parts[name].gpu_minutes / 60:.1f}" for name in order)
        largest = max(order, key=lambda name: parts[name].gpu_minutes) if order else "stalled"
        advice = {
            "startup": "its GPUs sat idle before its first step: load data and restore checkpoints before "
                       "asking for GPUs, or cache the dataset on the node",
            "checkpoint": "its GPUs sat idle while it wrote checkpoints: write them asynchronously or less often",
            "stalled": "its GPUs sat idle while it ran: feed them faster (more data-loader workers, prefetch), "
                       "move evaluation off the GPUs' time, or look for a hung job",
        }[largest]
        return Waste(HELD_IDLE, where, gpu_hours, total.cost,
                     f"{_upper_first(where)} held {gpu_hours:.1f} GPU-h (${total.cost:,.2f}) of GPUs measured idle "
                     f"while running (GPU-h by part: {split}); {advice}.")

    def by_cluster(self, usage: str, cluster_id: str, total: _Sum) -> Waste:
        gpu_hours = total.gpu_minutes / 60
        gpus = self.cluster_gpus(cluster_id)
        name = self.cluster_name(cluster_id)
        span = self.cluster_minutes.get(cluster_id, 0.0) / gpus  # minutes of the cluster in the window
        if usage == Usage.WAITING.value:
            waited = total.gpu_minutes / gpus
            share = 100 * waited / span if span else 0.0
            advice = (f"it waited {waited:.0f} of its {span:.0f} min with nothing placed ({share:.0f}%): "
                      f"tear it down sooner when the queue is empty")
        elif usage == Usage.UNALLOCATED.value:
            free = total.gpu_minutes / total.minutes if total.minutes else 0.0
            advice = (f"on average {free:.1f} of its {gpus} GPUs sat unallocated for {total.minutes:.0f} min: queue "
                      f"gangs of ≤{free:.0f} GPUs there or launch {max(gpus - round(free), 1)}-GPU shapes")
        elif usage == Usage.STRANDED.value:
            left = total.gpu_minutes / total.minutes if total.minutes else 0.0
            advice = (f"on average {left:.2f} GPU of the GPUs jobs shared sat unused beside their fractions for "
                      f"{total.minutes:.0f} min: queue fractions that fill them, or ask for shares that add up to one")
        elif usage == Usage.FINISHED.value:
            advice = f"finished jobs held its GPUs for {total.minutes:.0f} min: release GPUs as a job ends"
        elif usage == Usage.RESTARTING.value:
            advice = f"{total.minutes:.0f} min of checkpoint and restart: check restore speed on {name}"
        elif usage == Usage.QUEUE_DRAIN.value:
            advice = (f"its GPUs sat {total.minutes:.0f} min between one job's end and the next one's start: "
                      f"turn on eager allocation (BROKER_EAGER_POLICY=eager)")
        else:
            advice = f"{total.minutes:.0f} min marked {usage!r}"
        label = CAUSE_LABELS.get(usage, usage)
        return Waste(usage, name, gpu_hours, total.cost,
                     f"{_upper_first(name)} lost ${total.cost:,.2f} ({gpu_hours:.1f} GPU-h) to {label}; {advice}.")


def _upper_first(text: str) -> str:
    return text[:1].upper() + text[1:]


SLOWER_BY = 0.2  # a zone is called slower to come up when it took this share longer than the others, and
SLOWER_BY_MIN = 0.5  # at least this many minutes longer: "3 min vs 3 min elsewhere" is no advice


def slower(avg_min: float, elsewhere_min: float) -> bool:
    """Whether clusters in a zone came up clearly slower than elsewhere (worth telling)."""
    return avg_min - elsewhere_min >= max(SLOWER_BY * elsewhere_min, SLOWER_BY_MIN)


def minutes(value: float) -> str:
    """A time to come up: ``3 min 24 s`` under 10 minutes (whole minutes alone hide the difference), else ``42 min``."""
    if value < 10:
        whole, seconds = divmod(round(value * 60), 60)
        return f"{whole} min {seconds:02d} s" if whole else f"{seconds} s"
    return f"{value:.0f} min"
