"""The pool's size follows the queue: a cluster nobody holds is kept a while for the next job, then goes.

``clusters.reap`` asks ``keep`` about every live cluster no active job holds or is heading to. It is
kept while all of these hold (otherwise it is torn down as idle):

- the setting ``pool_idle_seconds`` is above zero, and the cluster is up (a cluster still booting
  for a job that was cancelled goes at once);
- it has been unheld for less than that long (market time, from the end of its last allocation);
- no job is queued: a queued job that did not take it cannot use it, and its GPUs count against
  ``max_gpus``, so keeping it would only hold the queue back. A job holding a reservation
  (``broker.engine.reservations``) counts as queued: it waits too, and should the job it waits for
  run late, the room is what lets it give the reservation up for a cluster of its own.

That is the hysteresis: a pool does not shrink the moment one job ends and grow again when the next
arrives a minute later, yet idle capacity never outlives the setting. The pool grows through the
ordinary launch of a queued job that fits no cluster, within ``max_gpus`` and, per queue (the
priority class a job file names, as the service's capacity shares count it), within
``queue_max_gpus``: ``queue_full`` says when a launch would go past it.
"""

from __future__ import annotations

from collections.abc import Collection
from datetime import datetime

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from broker.engine import reservations
from broker.engine.parts import Parts
from broker.model import ClusterState, JobState
from broker.service.timepolicy import queue_of
from broker.store.tables import AllocationRow, ClusterRow, JobRow


def idle_since(s: Session, row: ClusterRow) -> datetime | None:
    ended = s.scalar(select(func.max(AllocationRow.ended_at)).where(AllocationRow.cluster_id == row.id))
    return ended or row.up_at


def keep(parts: Parts, s: Session, row: ClusterRow, now: datetime) -> bool:
    """Whether an unheld cluster stays in the pool for now."""
    if parts.options.pool_idle_s <= 0 or row.state != ClusterState.UP.value:
        return False
    since = idle_since(s, row)
    if since is None or (now - since).total_seconds() >= parts.options.pool_idle_s:
        return False
    queued = s.scalar(select(JobRow.id).where(JobRow.state == JobState.PENDING.value,
                                              JobRow.after_job_id.is_(None)).limit(1))
    return queued is None and not reservations.held(s)


def queue_full(parts: Parts, s: Session, job: JobRow, gpus: int,
               leaving: str | Collection[str] | None = None) -> int | None:
    """The queue's limit if launching ``gpus`` more for ``job`` would pass it, else None.

    A queue holds the GPUs of the clusters up or coming up that were launched for its jobs (a
    migration's old cluster, ``leaving``, not counted).
    """
    limits = dict(parts.options.queue_max_gpus)
    queue = queue_of(job.spec)
    if queue not in limits:
        return None
    going = {leaving} if isinstance(leaving, str) else set(leaving or ())
    held = 0
    for row, spec in s.execute(select(ClusterRow, JobRow.spec).join(JobRow, JobRow.id == ClusterRow.job_id)
                               .where(ClusterRow.state.in_([ClusterState.PROVISIONING.value, ClusterState.UP.value]))):
        if row.id not in going and queue_of(spec) == queue:
            held += row.num_nodes * row.gpus_per_node
    return limits[queue] if held + gpus > limits[queue] else None
