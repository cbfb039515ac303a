"""The running jobs as one pass of a step sees them: which have nothing to do, read in a few statements.

A RUNNING job moves on (``JobStepper._from_running``) only when: a termination notice for its
cluster is open; the backend says its run ended, failed, was lost or never started; a periodic
checkpoint is due (``cadence``); a move it began has its new nodes up, or the market ticked since
its place was last reviewed (``review``). ``RunningView`` reads, once per pass and in a handful of
batched statements, what each of those needs: every running job with its allocation and cluster,
the clusters with an open notice, and for spot jobs the last checkpoint asked for, the newest one
reported, the measured save times and each zone's preemption record. A job of which all say
"nothing" (``quiet``) is passed over with no transaction of its own; the backend is still asked
its run status, as the full decision would ask it, but for all such jobs of the pass in one call
(``Provisioner.run_statuses``): a run that ends during the pass is seen by the next step. Anything
the view cannot rule out goes through the full decision, which is the one that decides.

A view is good while nothing moves: the step reads a new one for each pass, and after any job
whose advance changed something.
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import and_, func, select
from sqlalchemy.orm import Session

from broker.backends.base import RunPhase, RunStatus
from broker.engine.cadence import ASKED, HAZARD_COLUMNS, MEASURED_KEPT, Cadence, hazard_of
from broker.engine.notices import TERMINATE_KINDS
from broker.engine.parts import Parts, cluster_info
from broker.engine.planning import Reads
from broker.engine.review import Reviewer
from broker.model import JobState
from broker.store.tables import AllocationRow, CheckpointReportRow, ClusterRow, JobEventRow, JobRow, NoticeRow

CHUNK = 500  # ids per IN (...) list
# A checkpoint counted not due only when it is not due for this long yet: the view's sums may round
# apart from the full decision's by a hair, and at the very edge the full decision is the one to ask.
DUE_MARGIN = timedelta(milliseconds=1)


@dataclass(frozen=True, slots=True)
class Held:
    """A running job's cluster as the view reads it: its columns (a ``parts.Place``), not a loaded row."""

    id: str
    job_id: str | None
    cloud: str
    region: str
    zone: str
    instance_type: str
    num_nodes: int
    gpus_per_node: int
    spot: bool
    handle: dict[str, Any]


def _columns(held: Held) -> tuple[Any, ...]:
    return (held.id, held.job_id, held.cloud, held.region, held.zone, held.instance_type, held.num_nodes,
            held.gpus_per_node, held.spot, held.handle)


HELD_COLUMNS = (ClusterRow.id, ClusterRow.job_id, ClusterRow.cloud, ClusterRow.region, ClusterRow.zone,
                ClusterRow.instance_type, ClusterRow.num_nodes, ClusterRow.gpus_per_node, ClusterRow.spot,
                ClusterRow.handle)


@dataclass(frozen=True, slots=True)
class Running:
    job_id: str
    attempt: int
    heading_to: str | None  # its target cluster or GPUs: a move under way
    began: datetime
    cluster: Held


class RunningView:
    """One pass's reading of the running jobs."""

    def __init__(self, parts: Parts, cadence: Cadence, reviewer: Reviewer,
                 statuses: dict[tuple[str, int], RunStatus] | None = None,
                 kept: dict[str, Running] | None = None) -> None:
        """``statuses``: the run statuses this pass has read, by (job, attempt): kept by the pass across
        its views, so that a view read again after a job moved does not ask the backend again. ``kept``:
        the running jobs as the engine's last view read them (``_running``), updated here."""
        self.parts = parts
        self.statuses = statuses if statuses is not None else {}
        self.cadence = cadence
        self.reviewer = reviewer
        self.now = parts.clock.now()
        with parts.store.transaction() as s:
            rows = s.connection().execute(  # rows as they come, not the ORM's buffered result
                select(JobRow.id, JobRow.attempt, JobRow.target_cluster_id, JobRow.target_gpus,
                       AllocationRow.running_at, AllocationRow.started_at, *HELD_COLUMNS)
                .join(AllocationRow, and_(AllocationRow.job_id == JobRow.id, AllocationRow.attempt == JobRow.attempt))
                .join(ClusterRow, ClusterRow.id == AllocationRow.cluster_id)
                .where(JobRow.state == JobState.RUNNING.value))
            self.running = self._running(rows, kept if kept is not None else {})
            self.noticed = self._noticed(s) if self.running else set()
            spot = {j for j, r in self.running.items() if r.cluster.spot}
            self.asked = self._per_job(s, spot, select(JobEventRow.job_id, func.max(JobEventRow.at))
                                       .where(JobEventRow.kind == ASKED).group_by(JobEventRow.job_id),
                                       JobEventRow.job_id)
            self.newest = self._per_job(s, spot, select(CheckpointReportRow.job_id,
                                                        func.max(CheckpointReportRow.written_at))
                                        .group_by(CheckpointReportRow.job_id), CheckpointReportRow.job_id)
            self.saved = self._saved(s, spot)
            self.noticed_jobs = self._clusters_noticed_of(s, spot)
            self.hazards = self._hazards(s, sorted(spot))
            self._review(s, self.now)

    @staticmethod
    def _running(rows: Iterable[Any], kept: dict[str, Running]) -> dict[str, Running]:
        """The running jobs, each ``Running`` kept from the last view while its row reads the same: a view of
        thousands of running jobs then makes few new objects that outlive it (as ``queue.Shapes.queued``)."""
        found: dict[str, Running] = {}
        for job_id, attempt, target, gpus, running_at, started_at, *cluster in rows:
            heading_to, began = target or (str(gpus) if gpus else None), running_at or started_at
            running = kept.get(job_id)
            if running is None or (running.attempt, running.heading_to, running.began) != (attempt, heading_to, began) \
                    or _columns(running.cluster) != tuple(cluster):
                running = Running(job_id, attempt, heading_to, began, Held(*cluster))
            found[job_id] = running
        kept.clear()
        kept.update(found)
        return found

    def _review(self, s: Session, now: datetime) -> None:
        """Review at once the places of the running jobs due a review in the tick of ``now`` that own
        their cluster and head nowhere (``Reviewer.stays``, the store read once for all of them): those
        the policy keeps where they are count as reviewed; the others are left to the full decision."""
        self.reviewed_tick = self.reviewer.tick(now)
        due = sorted(job_id for job_id, r in self.running.items()
                     if r.heading_to is None and r.cluster.job_id == job_id and r.cluster.id not in self.noticed
                     and not self.reviewer.reviewed(job_id, now))
        if not due:
            return
        jobs: list[JobRow] = []
        for chunk in range(0, len(due), CHUNK):
            jobs += s.scalars(select(JobRow).where(JobRow.id.in_(due[chunk:chunk + CHUNK])))
        reads = Reads.of(s, jobs)
        for job in jobs:
            self.reviewer.stays(s, job, self.running[job.id].cluster, reads)

    @staticmethod
    def _noticed(s: Session) -> set[str]:
        """Clusters with a termination notice not yet acted on."""
        return set(s.scalars(select(NoticeRow.cluster_id).where(NoticeRow.kind.in_(TERMINATE_KINDS),
                                                                 NoticeRow.handled_at.is_(None)).distinct()))

    # The spot jobs' rows below are read joined to the running jobs, not by IN lists of their ids: on
    # PostgreSQL a statement with 500 ids is parsed afresh by the driver on every call (about 8 ms each,
    # 16 of them a step at 2,000 running), where a join is one short statement, prepared once. What the
    # join finds beyond ``spot`` (jobs that are not on spot clusters, or that began running since the view
    # read them) is left out, so each dict holds what the IN lists read.

    @staticmethod
    def _per_job(s: Session, spot: set[str], query: Any, column: Any) -> dict[str, datetime]:
        if not spot:
            return {}
        running = query.join(JobRow, JobRow.id == column).where(JobRow.state == JobState.RUNNING.value)
        return {job_id: at for job_id, at in s.execute(running) if at is not None and job_id in spot}

    @staticmethod
    def _saved(s: Session, spot: set[str]) -> dict[str, list[float]]:
        """Job -> its latest ``MEASURED_KEPT`` measured save times, newest first."""
        found: dict[str, list[float]] = defaultdict(list)
        if not spot:
            return found
        rank = func.row_number().over(partition_by=CheckpointReportRow.job_id,
                                      order_by=CheckpointReportRow.written_at.desc()).label("rank")
        ranked = (select(CheckpointReportRow.job_id, CheckpointReportRow.save_seconds, rank)
                  .join(JobRow, JobRow.id == CheckpointReportRow.job_id)
                  .where(JobRow.state == JobState.RUNNING.value, CheckpointReportRow.save_seconds.is_not(None))
                  .subquery())
        for job_id, seconds in s.execute(select(ranked.c.job_id, ranked.c.save_seconds)
                                         .where(ranked.c.rank <= MEASURED_KEPT).order_by(ranked.c.job_id,
                                                                                         ranked.c.rank)):
            if job_id in spot:
                found[job_id].append(seconds)
        return found

    @staticmethod
    def _clusters_noticed_of(s: Session, spot: set[str]) -> set[str]:
        """Jobs with a notice, any, on any cluster of theirs (a notice can measure a checkpoint's time)."""
        if not spot:
            return set()
        return spot & set(s.scalars(select(ClusterRow.job_id).join(NoticeRow, NoticeRow.cluster_id == ClusterRow.id)
                                    .join(JobRow, JobRow.id == ClusterRow.job_id)
                                    .where(JobRow.state == JobState.RUNNING.value).distinct()))

    def _hazards(self, s: Session, spot: list[str]) -> dict[tuple[str, str, str], float]:
        clusters = [self.running[j].cluster for j in spot if j in self.saved]  # the others need no hazard
        one_of = {(c.cloud, c.zone, c.instance_type): c for c in clusters}
        zones = set(one_of)
        rows: dict[tuple[str, str, str], list[tuple[datetime | None, datetime | None, str, str | None]]] = {
            zone: [] for zone in zones}
        clouds = sorted({cloud for cloud, _, _ in zones})
        for cloud in clouds:
            for row in s.execute(select(ClusterRow.zone, ClusterRow.instance_type, *HAZARD_COLUMNS)
                                 .where(ClusterRow.cloud == cloud, ClusterRow.spot.is_(True),
                                        ClusterRow.up_at.is_not(None))):
                key = (cloud, row[0], row[1])
                if key in rows:
                    rows[key].append((row[2], row[3], row[4], row[5]))
        # With the cloud's own expected uptime as the prior, as the full decision reads it.
        return {zone: hazard_of(found, self.now, self.cadence.cloud_uptime(one_of[zone], self.now))
                for zone, found in rows.items()}

    def quiet(self, job_id: str) -> bool:
        """True when the job certainly stays as it is this pass, with nothing to write or ask of it."""
        running = self.running.get(job_id)
        if running is None or running.heading_to is not None or running.cluster.id in self.noticed:
            return False
        cluster = running.cluster
        now = self.parts.clock.now()  # the full decision's moment, not the view's: time only makes more due
        if cluster.job_id == job_id and not self.reviewer.reviewed(job_id, now):
            if self.reviewer.tick(now) != self.reviewed_tick:  # the market ticked during the pass
                with self.parts.store.transaction() as s:
                    self._review(s, now)
            if not self.reviewer.reviewed(job_id, now):
                return False
        if cluster.spot and not self._not_due(running, now):
            return False
        return self._run_status(running).phase is RunPhase.RUNNING

    def _run_status(self, running: Running) -> RunStatus:
        """The run's status, from one backend call for every running job the pass may yet pass over
        (``Provisioner.run_statuses``), made at the first one asked and kept for the pass (``statuses``)."""
        key = (running.job_id, running.attempt)
        if key not in self.statuses:
            wanted = [r for r in self.running.values() if (r.job_id, r.attempt) not in self.statuses
                      and r.heading_to is None and r.cluster.id not in self.noticed]
            self.statuses.update(self.parts.provisioner.run_statuses(
                [(cluster_info(r.cluster), r.job_id, r.attempt) for r in wanted]))
        found = self.statuses.get(key)
        if found is None:
            found = self.statuses[key] = self.parts.provisioner.run_status(cluster_info(running.cluster),
                                                                           running.job_id, running.attempt)
        return found

    def _not_due(self, running: Running, now: datetime) -> bool:
        """No periodic checkpoint is due. The zone's hazard is the view's: read a moment earlier, it is
        no lower than the full decision's, so an interval shrinking with the hazard is no longer."""
        job_id, cluster = running.job_id, running.cluster
        saved = self.saved.get(job_id)
        if saved:
            measured: float | None = statistics.median(saved) * self.parts.clock.speed
        elif job_id in self.newest or job_id in self.noticed_jobs:
            return False  # measured from requests and notices: the full decision reads those
        else:
            measured = None
        asked = self.asked.get(job_id)
        if asked is not None and asked < running.began:
            asked = None
        zone = (cluster.cloud, cluster.zone, cluster.instance_type)
        return self.cadence.due(now, running.began, asked, self.newest.get(job_id), measured,
                                lambda: self.hazards[zone], cluster.cloud, margin=DUE_MARGIN) is None
