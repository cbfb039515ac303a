"""Periodic checkpoints: when to ask a running spot job for one, and how the interval is chosen.

A notice that is too short for the job's checkpoint (GCP and Azure give 30 s) leaves only the
checkpoints taken before it. Once per step for each running spot job this asks the checkpointing
policy (``policies/checkpointing.py``, Young/Daly by default) for an interval from:

- the zone's hazard: the broker's own record of preemptions there per second of spot time it ran
  there, with a prior worth one preemption (``policies.checkpointing.blended_hazard``): one per
  the cloud's own expected uptime where it states one (GCP's estimated uptime or daily preemption
  rate on the zone's quote, ``broker.market.capacity.prior_uptime_s``), else one per day;
- the job's checkpoint time, measured: the save times the job reports itself (``broker.job`` does,
  from its first save), else from each request to the first checkpoint reported after it, or from
  a notice's signal to its checkpoint; until one is measured the job is asked once after 15
  minutes, to measure it;
- the cloud's notice lead time.

The job is asked by the same signal a notice sends, and the request is an event of the job
(``checkpoint_asked``, with the interval and why), so a restarted engine knows it was made.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Iterable
from datetime import datetime, timedelta

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from broker.engine import checkpoint_reports
from broker.engine.parts import AfterCommit, Parts, Place, cluster_info
from broker.market.capacity import prior_uptime_s
from broker.model import ClusterState, TeardownReason
from broker.store.tables import (
    AllocationRow,
    CheckpointReportRow,
    ClusterRow,
    JobEventRow,
    JobRow,
    NoticeRow,
)
from policies.checkpointing import FIXED_INTERVAL_S, CheckpointRequest, blended_hazard
from providers.base import OfferKey, ProviderError
from providers.node_notice import NOTICE_LEAD_SECONDS

ASKED = "checkpoint_asked"
MEASURED_KEPT = 5


class Cadence:
    def __init__(self, parts: Parts) -> None:
        self.parts = parts
        self.policy = parts.policies.checkpointing

    def maybe_ask(self, s: Session, job: JobRow, alloc: AllocationRow, cluster: ClusterRow,
                  after: AfterCommit) -> None:
        if not cluster.spot:
            return
        now = self.parts.clock.now()
        began = alloc.running_at or alloc.started_at
        asked = s.scalar(select(func.max(JobEventRow.at)).where(JobEventRow.job_id == job.id,
                                                                 JobEventRow.kind == ASKED, JobEventRow.at >= began))
        newest = checkpoint_reports.newest(s, job)
        measured = self.checkpoint_seconds(s, job)
        due = self.due(now, began, asked, newest.written_at if newest else None, measured,
                       lambda: zone_hazard(s, cluster, now, self.cloud_uptime(cluster, now)), cluster.cloud)
        if due is None:
            return
        interval, why = due
        signal = self.parts.spec_of(job).broker.checkpoint.signal
        after.signals.append((cluster_info(cluster), job.id, job.attempt, signal))
        self.parts.event(s, job.id, ASKED, interval_s=round(interval, 1), checkpoint_s=measured, reason=why)

    def cloud_uptime(self, cluster: Place, now: datetime) -> float | None:
        """What the cloud expects of a spot VM's run in the cluster's zone (None: it says nothing)."""
        try:
            quote = self.parts.market.quote(
                OfferKey(cluster.cloud, cluster.region, cluster.zone, cluster.instance_type), now)
        except (LookupError, ProviderError):
            return None  # the market no longer quotes it: the default prior, never a failed step
        return prior_uptime_s(quote)

    def due(self, now: datetime, began: datetime, asked: datetime | None, newest: datetime | None,
            measured: float | None, hazard: Callable[[], float], cloud: str,
            margin: timedelta = timedelta(0)) -> tuple[float, str] | None:
        """(interval, why) when a checkpoint is due now, else None; ``hazard`` is read only once one
        is measured. ``margin``: say due that much early (a caller that only wants to know it is not)."""
        # The next one is due an interval after the newest of: the start of this attempt, the last
        # checkpoint reported and the last one asked for (answered or not: asking again at once
        # would only interrupt a job that is slow to answer).
        since = max([began, *(t for t in (asked, newest) if t is not None)])
        if measured is None:
            interval, why = FIXED_INTERVAL_S, "to measure how long a checkpoint takes"
        else:
            plan = self.policy(CheckpointRequest(hazard_per_s=hazard(), checkpoint_s=measured,
                                                 notice_s=NOTICE_LEAD_SECONDS.get(cloud, 0.0)))
            if plan.interval_s is None:
                return None
            interval, why = plan.interval_s, plan.reason
        if now - since < timedelta(seconds=interval) - margin:
            return None
        return interval, why

    def checkpoint_seconds(self, s: Session, job: JobRow) -> float | None:
        """The job's measured checkpoint time (median of its latest ones), or None before any.

        The save times the job measured itself (``broker.job`` writes them in ``LATEST``) come first,
        from its first checkpoint on; without them, the time from each request to its checkpoint.
        """
        saved = list(s.scalars(select(CheckpointReportRow.save_seconds).where(
            CheckpointReportRow.job_id == job.id, CheckpointReportRow.save_seconds.is_not(None))
            .order_by(CheckpointReportRow.written_at.desc()).limit(MEASURED_KEPT)))
        if saved:
            return statistics.median(x for x in saved if x is not None) * self.parts.clock.speed
        asks = list(s.scalars(select(JobEventRow.at).where(JobEventRow.job_id == job.id, JobEventRow.kind == ASKED)
                              .order_by(JobEventRow.at.desc()).limit(MEASURED_KEPT)))
        samples: list[float] = []
        for at in asks:
            first = s.scalar(select(func.min(CheckpointReportRow.written_at)).where(
                CheckpointReportRow.job_id == job.id, CheckpointReportRow.written_at >= at))
            if first is not None:
                samples.append((first - at).total_seconds())
        for detail in s.scalars(select(NoticeRow.detail).join(ClusterRow, ClusterRow.id == NoticeRow.cluster_id)
                                .where(ClusterRow.job_id == job.id)):
            signaled, written = (detail or {}).get("signaled_at"), (detail or {}).get("checkpoint_at")
            if signaled and written:
                samples.append((datetime.fromisoformat(written) - datetime.fromisoformat(signaled)).total_seconds()
                               * self.parts.clock.speed)
        samples = [x for x in samples if x >= 0]
        return statistics.median(samples) if samples else None


HAZARD_COLUMNS = (ClusterRow.up_at, ClusterRow.terminated_at, ClusterRow.state, ClusterRow.teardown_reason)


def zone_hazard(s: Session, cluster: ClusterRow, now: datetime, prior_uptime: float | None = None) -> float:
    """Preemptions per second of spot time the broker ran in the cluster's zone and instance type,
    blended with a prior of one preemption per ``prior_uptime`` seconds (a day when None)."""
    rows = s.execute(select(*HAZARD_COLUMNS)
                     .where(ClusterRow.cloud == cluster.cloud, ClusterRow.zone == cluster.zone,
                            ClusterRow.instance_type == cluster.instance_type, ClusterRow.spot.is_(True),
                            ClusterRow.up_at.is_not(None)))
    return hazard_of(rows, now, prior_uptime)


def hazard_of(rows: Iterable[tuple[datetime | None, datetime | None, str, str | None]], now: datetime,
              prior_uptime: float | None = None) -> float:
    """``zone_hazard`` over one zone's spot clusters (up_at, terminated_at, state, teardown_reason)."""
    preemptions, seconds = 0, 0.0
    for up_at, ended, state, reason in rows:
        if up_at is None:
            continue
        seconds += max(((ended or now) - up_at).total_seconds(), 0.0)
        preemptions += int(state == ClusterState.TERMINATED.value and reason == TeardownReason.CLOUD.value)
    return blended_hazard(preemptions, seconds, prior_uptime)
