"""The pool's size follows the queue: a cluster nobody holds is kept a while for the next job, then goes.

``clusters.reap`` asks ``keep`` about every live cluster no active job holds or is heading to. It is
kept while all of these hold (otherwise it is torn down as idle):

- the setting ``pool_idle_seconds`` is above zero, and the cluster is up (a cluster still booting
  for a job that was cancelled goes at once);
- it has been unheld for less than that long (market time, from the end of its last allocation);
- no job is queued: a queued job that did not take it cannot use it, and its GPUs count against
  ``max_gpus``, so keeping it would only hold the queue back.

That is the hysteresis: a pool does not shrink the moment one job ends and grow again when the next
arrives a minute later, yet idle capacity never outlives the setting. The pool grows through the
ordinary launch of a queued job that fits no cluster, within ``max_gpus``.
"""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from broker.engine.parts import Parts
from broker.model import ClusterState, JobState
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
    return s.scalar(select(JobRow.id).where(JobRow.state == JobState.PENDING.value).limit(1)) is None
