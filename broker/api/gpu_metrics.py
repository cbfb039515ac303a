"""Per-job GPU figures for Prometheus, under the names and labels of NVIDIA's DCGM exporter.

For every GPU of every running job, the latest minute its agent measured: ``DCGM_FI_DEV_GPU_UTIL``
(percent), ``DCGM_FI_DEV_MEM_COPY_UTIL`` (percent), ``DCGM_FI_DEV_FB_USED`` and
``DCGM_FI_DEV_FB_FREE`` (MiB), ``DCGM_FI_DEV_POWER_USAGE`` (W), labelled as the exporter labels
them (``gpu``, ``UUID``, ``Hostname``, ``modelName``) plus ``job_id`` and ``team``, so a dashboard
built for DCGM reads them and can group by job. Minutes older than ``FRESH`` are left out: a job
whose agent stopped reporting shows no figure rather than a stale one.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta

from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector
from sqlalchemy import and_, func, select

from broker.clock import Clock
from broker.model import JobState
from broker.store import Store
from broker.store.gpu import GpuMinuteRow
from broker.store.tables import ClusterRow, JobRow

FRESH = timedelta(minutes=10)
LABELS = ["gpu", "UUID", "Hostname", "modelName", "job_id", "team"]
SERIES = (  # (name, help, the minute's figure)
    ("DCGM_FI_DEV_GPU_UTIL", "GPU utilization (in %), mean of the job's latest measured minute", "utilization"),
    ("DCGM_FI_DEV_MEM_COPY_UTIL", "Memory utilization (in %), mean of the latest minute", "memory_utilization"),
    ("DCGM_FI_DEV_FB_USED", "Framebuffer memory used (in MiB), peak of the latest minute", "fb_used"),
    ("DCGM_FI_DEV_FB_FREE", "Framebuffer memory free (in MiB), at the latest minute's peak use", "fb_free"),
    ("DCGM_FI_DEV_POWER_USAGE", "Power draw (in W), mean of the latest minute", "power"),
)


class GpuCollector(Collector):
    def __init__(self, store: Store, clock: Clock) -> None:
        self.store, self.clock = store, clock

    def collect(self) -> Iterator[Metric]:
        families = {name: GaugeMetricFamily(name, help_text, labels=LABELS) for name, help_text, _ in SERIES}
        since = self.clock.now() - FRESH
        M = GpuMinuteRow
        with self.store.transaction() as s:
            latest = (select(M.job_id, M.node, M.gpu, func.max(M.started_at).label("at"))
                      .join(JobRow, JobRow.id == M.job_id)
                      .where(JobRow.state == JobState.RUNNING.value, M.attempt == JobRow.attempt, M.started_at >= since)
                      .group_by(M.job_id, M.node, M.gpu).subquery())
            rows = s.execute(
                select(M, JobRow.team, ClusterRow.accelerator)
                .join(latest, and_(M.job_id == latest.c.job_id, M.node == latest.c.node, M.gpu == latest.c.gpu,
                                   M.started_at == latest.c.at))
                .join(JobRow, JobRow.id == M.job_id).outerjoin(ClusterRow, ClusterRow.id == M.cluster_id)).all()
        for minute, team, accelerator in rows:
            util = minute.job_utilization_mean if minute.job_utilization_mean is not None else minute.utilization_mean
            used = minute.job_memory_mb_max if minute.job_memory_mb_max is not None else minute.memory_used_mb_max
            free = (minute.memory_total_mb - minute.memory_used_mb_max
                    if minute.memory_total_mb is not None and minute.memory_used_mb_max is not None else None)
            values = {"utilization": util, "memory_utilization": minute.memory_utilization_mean, "fb_used": used,
                      "fb_free": free, "power": minute.power_w_mean}
            labels = [str(minute.gpu), minute.uuid, f"{minute.cluster_id}:{minute.node}", accelerator or "",
                      minute.job_id, team]
            for name, _, figure in SERIES:
                value = values[figure]
                if value is not None:
                    families[name].add_metric(labels, float(value))
        yield from families.values()


