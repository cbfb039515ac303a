"""The queue as one pass of a step sees it: which queued jobs cannot move, read in a few statements.

A queued job leaves PENDING only through one of these doors (``JobStepper._from_pending``): its
pipeline stage is released, it is placed on free GPUs of a cluster that is up, a cluster is
launched for it, or it takes GPUs from lower-priority gangs. ``QueueView`` reads, once per pass
and in a handful of batched statements, what each door needs, and says of a queued job that
every door is shut (``waits``), so that the full decision (a transaction, its reads, the
selection policy) is spent only on the jobs that might move. It is conservative: a job it cannot
rule out goes through the full decision, which is the one that decides.

- **stage**: the stage before it has not ended (a chained stage is held back, nothing written);
- **free GPUs**: no cluster that is up with its accelerator has as many GPUs not fully held as the
  job needs (its smallest choice of GPUs per node, times its nodes), counting running
  allocations and the claims of jobs heading there;
- **launch**: the pool (``max_gpus``), or else its queue (``queue_max_gpus``), has no room for its
  smallest possible cluster, and the job's last word on waiting already says so (``fleet_full``
  or ``queue_full`` with the same limit: the full decision would write nothing new);
- **preemption**: no running job has a lower priority (the default policy takes only those).

A view is good while nothing moves: the step reads a new one after any job whose advance changed
something, and for its second pass over the queue unless nothing in the process wrote to the store
since the first pass's view was read. Reading one costs a few statements whatever the queue's
length; what is per queued job is kept between views (``Shapes``: shapes, each job's row while it
reads the same, its last word on waiting by event id, and each open allocation's GPUs).
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable
from dataclasses import dataclass

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from broker.engine import clusters
from broker.engine.parts import Parts, jsonable
from broker.engine.shares import EPSILON
from broker.model import ACTIVE_STATES, ClusterState, JobState
from broker.service.timepolicy import queue_of
from broker.store.tables import AllocationRow, ClusterRow, JobEventRow, JobRow

# The preemption policies whose victims are only gangs of strictly lower priority.
LOWER_PRIORITY_ONLY = (None, "checkpoint_aware")


@dataclass(frozen=True, slots=True)
class Shape:
    """What a queued job needs, from its spec (which never changes): per accelerator, GPUs per node."""

    per_node: dict[str, int]  # accelerator, lowercased -> the fewest GPUs per node of that choice
    queue: str
    gang: Hashable  # all the spec says of where its gang may go: jobs alike in it fare alike in preemption

    @property
    def gpu_free(self) -> bool:
        return not self.per_node  # a task without accelerators: GPU limits never hold it


@dataclass(frozen=True, slots=True)
class Queued:
    job_id: str
    priority: int
    num_nodes: int
    after_job_id: str | None


class Shapes:
    """Queued jobs' shapes, kept for the engine's life (a job's spec never changes), and their last words
    on waiting, kept by event (an event never changes): a view reads each of them once, not every pass."""

    def __init__(self, parts: Parts) -> None:
        self.parts = parts
        self._known: dict[str, Shape] = {}
        self._queued: dict[str, Queued] = {}
        self.wait_ids: dict[str, int] = {}  # job -> the id of its last word on waiting
        self.wait_words: dict[str, tuple[str, dict[str, object]]] = {}  # job -> that word: (kind, detail)
        # Open allocations' GPUs, by allocation id: an allocation's GPUs never change once written.
        self.holds: dict[int, tuple[tuple[int, int], ...]] = {}

    def of(self, s: Session, job_ids: Iterable[str]) -> dict[str, Shape]:
        wanted = list(job_ids)
        missing = [j for j in wanted if j not in self._known]
        for chunk in range(0, len(missing), 500):
            for job in s.scalars(select(JobRow).where(JobRow.id.in_(missing[chunk:chunk + 500]))):
                spec = self.parts.spec_of(job)
                per_node: dict[str, int] = {}
                for choice in spec.accelerators:
                    name = choice.name.lower()
                    per_node[name] = min(per_node.get(name, choice.count), choice.count)
                gang = (tuple((a.name.lower(), a.count, a.fraction, a.instance_types) for a in spec.accelerators),
                        spec.allowed_regions, spec.broker.topology)
                self._known[job.id] = Shape(per_node, queue_of(job.spec), gang)
        return {j: self._known[j] for j in wanted if j in self._known}

    def queued(self, s: Session) -> dict[str, Queued]:
        """The queued jobs, by id. Read through the session's connection (rows as they come, not the ORM's
        buffered result), and each job's ``Queued`` kept while its row reads the same: a view of thousands
        of queued jobs then makes few new objects that outlive it, which the garbage collector's full
        collections, each scanning the whole process, are run in proportion to."""
        kept = self._queued
        self._queued = found = {}
        for row in s.connection().execute(select(JobRow.id, JobRow.priority, JobRow.num_nodes, JobRow.after_job_id)
                                          .where(JobRow.state == JobState.PENDING.value)):
            job_id, priority, num_nodes, after = row
            queued = kept.get(job_id)
            if queued is None or queued.priority != priority or queued.num_nodes != num_nodes \
                    or queued.after_job_id != after:
                queued = Queued(job_id, priority, num_nodes, after)
            found[job_id] = queued
        return found

    def forget(self, keep: set[str]) -> None:
        for job_id in [j for j in self._known if j not in keep]:
            del self._known[job_id]


class QueueView:
    """One pass's reading of the queue and of the capacity it waits for."""

    def __init__(self, parts: Parts, shapes: Shapes) -> None:
        self.parts = parts
        options = parts.options
        with parts.store.transaction() as s:
            self.queued = shapes.queued(s)
            shapes.forget(set(self.queued))
            self.shapes = shapes.of(s, self.queued)
            self.before = self._stages_before(s)
            self.free = self._free_gpus(s, shapes)
            self.fleet = clusters.fleet_gpus(s)
            self.queues = self._queue_gpus(s) if options.queue_max_gpus else {}
            self.last_wait = self._last_waits(s, shapes)
            lowest = s.scalar(select(func.min(JobRow.priority)).where(JobRow.state == JobState.RUNNING.value))
            self.lowest_running = lowest
        self.may_preempt_any = options.preemption_policy not in LOWER_PRIORITY_ONLY
        # What a job's last word says when the pool or its queue holds it back (the full decision's words).
        self._fleet_full = ("fleet_full", jsonable({"max_gpus": options.max_gpus}))
        self._queue_limits = dict(options.queue_max_gpus)
        self._queue_full = {queue: ("queue_full", jsonable({"queue_max_gpus": limit}))
                            for queue, limit in self._queue_limits.items()}
        self._no_preemption: set[Hashable] = set()
        self._waiting: set[str] = set()  # jobs this view said wait

    def _stages_before(self, s: Session) -> dict[str, str]:
        ids = sorted({q.after_job_id for q in self.queued.values() if q.after_job_id is not None})
        found: dict[str, str] = {}
        for chunk in range(0, len(ids), 500):
            rows = s.execute(select(JobRow.id, JobRow.state).where(JobRow.id.in_(ids[chunk:chunk + 500])))
            found.update({job_id: state for job_id, state in rows})
        return found

    def _free_gpus(self, s: Session, shapes: Shapes) -> dict[str, int]:
        """accelerator, lowercased -> the most GPUs not fully held on one cluster of it that is up. The open
        allocations are read as ids, their GPUs decoded once per allocation (``Shapes.holds``)."""
        up = {cid: (nodes, per_node, accelerator) for cid, nodes, per_node, accelerator in s.execute(
            select(ClusterRow.id, ClusterRow.num_nodes, ClusterRow.gpus_per_node, ClusterRow.accelerator)
            .where(ClusterRow.state == ClusterState.UP.value))}
        use: dict[str, dict[tuple[int, int], float]] = {cid: {} for cid in up}
        held: set[tuple[str, str]] = set()
        allocations = s.connection().execute(
            select(AllocationRow.id, AllocationRow.job_id, AllocationRow.cluster_id, AllocationRow.gpu_share)
            .join(ClusterRow, ClusterRow.id == AllocationRow.cluster_id)
            .where(AllocationRow.ended_at.is_(None), ClusterRow.state == ClusterState.UP.value)).all()
        known = shapes.holds
        unseen = sorted(alloc_id for alloc_id, *_ in allocations if alloc_id not in known)
        for chunk in range(0, len(unseen), 500):
            for alloc_id, gpus in s.execute(select(AllocationRow.id, AllocationRow.gpus)
                                            .where(AllocationRow.id.in_(unseen[chunk:chunk + 500]))):
                known[alloc_id] = _slots(gpus)
        for alloc_id, job_id, cid, share in allocations:
            held.add((cid, job_id))
            _hold(use[cid], known[alloc_id], share)
        shapes.holds = {alloc_id: known[alloc_id] for alloc_id, *_ in allocations if alloc_id in known}
        for job_id, target, claim, share in s.execute(
                select(JobRow.id, JobRow.target_cluster_id, JobRow.target_gpus, JobRow.gpu_share)
                .join(ClusterRow, ClusterRow.id == JobRow.target_cluster_id)
                .where(JobRow.state.in_(ACTIVE_STATES), ClusterRow.state == ClusterState.UP.value)):
            if target is not None and claim and (target, job_id) not in held:
                _hold(use[target], _slots(claim), share)
        free: dict[str, int] = {}
        for cid, (nodes, per_node, accelerator) in up.items():
            taken = sum(1 for (rank, gpu), part in use[cid].items()
                        if 0 <= rank < nodes and 0 <= gpu < per_node and part >= 1.0 - EPSILON)
            name = (accelerator or "").lower()
            free[name] = max(free.get(name, 0), nodes * per_node - taken)
        return free

    def _queue_gpus(self, s: Session) -> dict[str, int]:
        held: dict[str, int] = {}
        for nodes, per_node, spec in s.execute(
                select(ClusterRow.num_nodes, ClusterRow.gpus_per_node, JobRow.spec)
                .join(JobRow, JobRow.id == ClusterRow.job_id).where(ClusterRow.state.in_(clusters.HOLDING))):
            queue = queue_of(spec)
            held[queue] = held.get(queue, 0) + nodes * per_node
        return held

    def _last_waits(self, s: Session, shapes: Shapes) -> dict[str, tuple[str, dict[str, object]]]:
        """Queued job -> its last event among those that open or end a spell of waiting on a limit: the
        events' ids read for every queued job, the kind and detail only of those not seen before."""
        kinds = (*clusters.BLOCKED, *clusters.UNBLOCKED)
        newest: dict[str, int] = {job_id: event_id for job_id, event_id in s.connection().execute(
            select(JobEventRow.job_id, func.max(JobEventRow.id)).join(JobRow, JobRow.id == JobEventRow.job_id)
            .where(JobRow.state == JobState.PENDING.value, JobEventRow.kind.in_(kinds))
            .group_by(JobEventRow.job_id))}
        ids, words = shapes.wait_ids, shapes.wait_words
        unseen = sorted(event_id for job_id, event_id in newest.items() if ids.get(job_id) != event_id)
        for chunk in range(0, len(unseen), 500):
            for event_id, job_id, kind, detail in s.execute(
                    select(JobEventRow.id, JobEventRow.job_id, JobEventRow.kind, JobEventRow.detail)
                    .where(JobEventRow.id.in_(unseen[chunk:chunk + 500]))):
                ids[job_id], words[job_id] = event_id, (kind, detail)
        if len(ids) != len(newest) or unseen:  # the jobs that left the queue are dropped
            for job_id in [j for j in ids if j not in newest]:
                del ids[job_id], words[job_id]
        return words

    def waits(self, job_id: str) -> bool:
        """True when the job certainly stays PENDING this pass, with nothing to write about it."""
        if job_id in self._waiting:
            return True
        queued = self.queued.get(job_id)
        shape = self.shapes.get(job_id)
        if queued is None or shape is None or shape.gpu_free:
            return False
        if queued.after_job_id is not None:
            before = self.before.get(queued.after_job_id)
            waits = before is not None and not JobState(before).terminal
        else:
            waits = not self.may_place(job_id) and self._launch_refused(queued, shape) and not self.may_preempt(job_id)
        if waits:  # while the view holds, it stays so (what it learns, ``no_preemption``, only shuts doors)
            self._waiting.add(job_id)
        return waits

    def may_place(self, job_id: str) -> bool:
        """False when no cluster that is up has room for the job's GPUs (True: the full decision tells)."""
        queued, shape = self.queued.get(job_id), self.shapes.get(job_id)
        if queued is None or shape is None or shape.gpu_free:
            return True
        return any(self.free.get(name, 0) >= queued.num_nodes * per_node for name, per_node in shape.per_node.items())

    def _launch_refused(self, queued: Queued, shape: Shape) -> bool:
        smallest = queued.num_nodes * min(shape.per_node.values())  # an offer's nodes have at least that many
        options = self.parts.options
        last = self.last_wait.get(queued.job_id)
        if options.max_gpus is not None and self.fleet + smallest > options.max_gpus:
            return last == self._fleet_full
        limit = self._queue_limits.get(shape.queue)
        if limit is not None and self.queues.get(shape.queue, 0) + smallest > limit:
            return last == self._queue_full[shape.queue]
        return False

    def may_preempt(self, job_id: str) -> bool:
        """False when no running job has a lower priority than the job, or a job alike (same priority,
        nodes and gang) found no gang to preempt in this view (True: the preemption policy tells)."""
        queued = self.queued.get(job_id)
        if queued is None or self.may_preempt_any:
            return True
        alike = self._alike(queued)
        if alike is not None and alike in self._no_preemption:
            return False
        lowest = self.lowest_running
        return lowest is not None and lowest < queued.priority

    def no_preemption(self, job_id: str) -> None:
        """The preemption policy found nothing to take for this job: nor will it for jobs alike, in this view."""
        queued = self.queued.get(job_id)
        alike = self._alike(queued) if queued is not None else None
        if alike is not None:
            self._no_preemption.add(alike)

    def _alike(self, queued: Queued) -> Hashable | None:
        shape = self.shapes.get(queued.job_id)
        return (queued.priority, queued.num_nodes, shape.gang) if shape is not None else None


def _slots(gpus: dict[str, list[int]]) -> tuple[tuple[int, int], ...]:
    """An allocation's or a claim's GPUs as (node rank, GPU) pairs."""
    return tuple((int(rank), int(gpu)) for rank, held in gpus.items() for gpu in held)


def _hold(use: dict[tuple[int, int], float], slots: tuple[tuple[int, int], ...], share: float | None) -> None:
    part = 1.0 if share is None else share
    for key in slots:
        use[key] = use.get(key, 0.0) + part
