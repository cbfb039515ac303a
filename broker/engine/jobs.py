"""Moving one job on: what the engine does with a job in each state, and starting it once its GPUs are ready.

``advance`` reads the job's state and hands it to the one function that knows what that state
waits for; every state change itself is a call into ``machine``. Provisioner calls are collected
in an ``AfterCommit`` and made once the job's transaction has committed.
"""

from __future__ import annotations

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from broker.backends.base import ClusterInfo, JobLaunch, RunPhase
from broker.engine import clusters, machine, packing, setup_ahead, stages
from broker.engine.cadence import Cadence
from broker.engine.checkpoints import (
    close_attempt,
    current_allocation,
    end_allocation,
    grace_over,
    noticed_at,
    record_checkpoint,
    refresh_checkpoint,
    reported_since,
)
from broker.engine.notices import open_notice
from broker.engine.parts import AfterCommit, Parts, cluster_info
from broker.engine.planning import Planner
from broker.engine.queue import QueueView
from broker.engine.review import Reviewer
from broker.model import CheckpointReason, ClusterState, JobState, TeardownReason
from broker.store.tables import AllocationRow, ClusterRow, JobEventRow, JobRow
from policies.gang import GangPlacement
from policies.selection import IDLE, Location
from providers.base import OfferKey

MAX_ERROR_CHARS = 500  # of a start's error, kept as the job's reason


class JobStepper:
    def __init__(self, parts: Parts, planner: Planner) -> None:
        self.parts = parts
        self.planner = planner
        self.reviewer = Reviewer(parts, planner)
        self.cadence = Cadence(parts)

    def advance(self, job_id: str, view: QueueView | None = None) -> bool:
        """Move one job on by at most one transition, then start it if its GPUs are ready. True when
        anything may have changed for the others (its state moved, or the provisioner was called for more
        than asking it to checkpoint).
        ``view``: the queue as this pass reads it, to pass over the doors it says are shut."""
        parts = self.parts
        after = AfterCommit()
        with parts.store.transaction() as s:
            job = s.get(JobRow, job_id, with_for_update=True)
            if job is None or JobState(job.state).terminal:
                return False
            state = JobState(job.state)
            if state is JobState.PENDING:
                if parts.options.admit is not None and not parts.options.admit(s, job):
                    return False
                self._from_pending(s, job, after, view)
            elif state in (JobState.PROVISIONING, JobState.MIGRATING):
                self._from_provisioning(s, job, after)
            elif state is JobState.RUNNING:
                self._from_running(s, job, after)
            elif state is JobState.CHECKPOINTING:
                self._from_checkpointing(s, job, after)
        self._carry_out(after)
        moved = JobState(job.state) is not state or after.changed_others
        if job.state in (JobState.PROVISIONING.value, JobState.MIGRATING.value):  # only these start
            moved = self.start_if_ready(job_id) or moved
        return moved

    def _from_pending(self, s: Session, job: JobRow, after: AfterCommit, view: QueueView | None) -> None:
        parts = self.parts
        if stages.held_back(parts, s, job):
            return
        if (view is None or view.may_place(job.id)) and packing.place_on_existing(parts, s, job):
            return
        exclude = self.planner.avoid(s, job)
        row = clusters.launch(parts, s, job, self.planner.plan(s, job, Location(IDLE), exclude), exclude, after)
        if row is not None:
            if job.started_at is None:
                job.started_at = parts.clock.now()
            machine.provisioning(s, parts.clock, job, cluster=row.id, zone=row.zone)
            return
        if (view is None or view.may_preempt(job.id)) and not packing.preempt_for(parts, s, job, after) \
                and view is not None:
            view.no_preemption(job.id)

    def _from_provisioning(self, s: Session, job: JobRow, after: AfterCommit) -> None:
        if clusters.target_of(s, job) is not None:
            return  # coming up, or up: start_if_ready runs after this transaction
        job.target_cluster_id = job.target_gpus = None
        previous = current_allocation(s, job)
        leaving = previous.cluster_id if previous is not None and previous.ended_at is None else None
        exclude = self.planner.avoid(s, job)
        plan = self.planner.plan(s, job, Location(IDLE), exclude)
        row = clusters.launch(self.parts, s, job, plan, exclude, after, leaving=leaving)
        if row is None and JobState(job.state) is JobState.PROVISIONING:
            machine.requeued(s, self.parts.clock, job, reason="no offer could be launched; waiting")

    def _from_running(self, s: Session, job: JobRow, after: AfterCommit) -> None:
        parts, clock = self.parts, self.parts.clock
        alloc = current_allocation(s, job)
        if alloc is None:
            return
        cluster = s.get(ClusterRow, alloc.cluster_id)
        assert cluster is not None
        notice = open_notice(s, cluster.id)
        if notice is not None:
            notice.handled_at = clock.now()
            alloc.stopping_at = notice.received_at
            job.preemptions += 1
            record_checkpoint(clock, job, notice)
            machine.checkpointing(s, clock, job, CheckpointReason.NOTICE, cluster=cluster.id, zone=cluster.zone,
                                  notice=notice.kind, action_time=notice.action_time)
            self._launch_replacement(s, job, cluster, after)
            return
        run = parts.provisioner.run_status(cluster_info(cluster), job.id, job.attempt)
        if run.phase is RunPhase.SUCCEEDED:
            end_allocation(alloc, "succeeded", clock.now())
            machine.succeeded(s, clock, job)
        elif run.phase is RunPhase.FAILED:
            end_allocation(alloc, "failed", clock.now())
            machine.failed(s, clock, job, run.exit_code)
        elif run.phase is RunPhase.LOST:
            # The nodes vanished without a notice (or before one was heard): recover from the checkpoint.
            job.preemptions += 1
            machine.migrating(s, clock, job, cluster=cluster.id, reason="nodes lost without notice")
            self._launch_replacement(s, job, cluster, after)
        elif run.phase is RunPhase.START_FAILED:
            self._start_failed(s, job, alloc, cluster, run.reason or f"the start exited with code {run.exit_code}",
                               after)
        elif run.phase is RunPhase.NO_PROCESS:
            self._restart(s, job, alloc, cluster, run.reason or "a node of it has no process", after)
        elif run.phase is RunPhase.NOT_STARTED:
            # Recorded as started, never started: the engine stopped between the two. Starting is idempotent.
            after.starts.append(self._job_launch(job, cluster, GangPlacement.from_json(cluster.id, alloc.gpus)))
        else:
            self.cadence.maybe_ask(s, job, alloc, cluster, after)
            self.reviewer.review(s, job, alloc, cluster, after)

    def _carry_out(self, after: AfterCommit) -> None:
        after.carry_out(self.parts.provisioner, start_failed=self._start_raised)

    def _start_raised(self, info: ClusterInfo, launch: JobLaunch, error: Exception) -> None:
        """The provisioner could not start the job (the node refused the command, the cluster went away)."""
        after = AfterCommit()
        with self.parts.store.transaction() as s:
            job = s.get(JobRow, launch.job_id, with_for_update=True)
            if job is None or job.state != JobState.RUNNING.value or job.attempt != launch.attempt:
                return
            alloc = current_allocation(s, job)
            cluster = s.get(ClusterRow, info.id)
            if alloc is None or cluster is None or alloc.cluster_id != cluster.id:
                return
            said = " ".join(str(error).split())[:MAX_ERROR_CHARS]
            self._start_failed(s, job, alloc, cluster, f"{type(error).__name__}: {said}", after)
        self._carry_out(after)

    def _start_failed(self, s: Session, job: JobRow, alloc: AllocationRow, cluster: ClusterRow, error: str,
                      after: AfterCommit) -> None:
        """End the attempt; try again on the same GPUs, or, after ``start_retries`` retries, fail the job."""
        parts = self.parts
        tries = 1 + int(s.scalar(select(func.count()).select_from(JobEventRow).where(
            JobEventRow.job_id == job.id, JobEventRow.kind == "start_failed")) or 0)
        parts.event(s, job.id, "start_failed", cluster=cluster.id, attempt=job.attempt, error=error, tries=tries)
        after.stops.append((cluster_info(cluster), job.id, job.attempt))  # whatever of it did start
        end_allocation(alloc, "start_failed", parts.clock.now())
        if tries > parts.options.start_retries:
            machine.start_failed(s, parts.clock, job, tries, error)  # its clusters are reaped: nothing holds them
            return
        job.target_cluster_id, job.target_gpus = cluster.id, alloc.gpus
        job.zones = job.zones[:-1]  # it never ran there; the next start adds the zone again
        machine.start_retried(s, parts.clock, job, cluster=cluster.id, error=error, tries=tries,
                              retries_left=parts.options.start_retries - tries + 1)

    def _restart(self, s: Session, job: JobRow, alloc: AllocationRow, cluster: ClusterRow, why: str,
                 after: AfterCommit) -> None:
        """A node of the attempt has no process and none will come (its broker died between the claim and
        the launch, or its agent died unheard), the nodes still up: end the attempt, counting the work since
        the last checkpoint as lost, and start the next one on the same GPUs from that checkpoint. The
        broker's fault, not the job's: it is no failed start and uses none of ``start_retries``."""
        clock = self.parts.clock
        self.parts.event(s, job.id, "no_process", cluster=cluster.id, attempt=job.attempt, reason=why)
        after.stops.append((cluster_info(cluster), job.id, job.attempt))  # whatever of it runs, and its claims
        refresh_checkpoint(s, clock, job, cluster.id)
        end_allocation(alloc, "no_process", clock.now())
        close_attempt(job, alloc, clock.now())
        job.target_cluster_id, job.target_gpus = cluster.id, alloc.gpus
        job.zones = job.zones[:-1]  # the next start adds the zone again
        machine.start_retried(s, clock, job, cluster=cluster.id, reason=why, checkpoint=job.checkpoint)

    def _launch_replacement(self, s: Session, job: JobRow, cluster: ClusterRow, after: AfterCommit) -> None:
        exclude = self.planner.avoid(s, job)
        if cluster.spot:  # never straight back into the zone that just took the nodes away
            exclude.add(str(OfferKey(cluster.cloud, cluster.region, cluster.zone, cluster.instance_type)))
        plan = self.planner.plan(s, job, self.planner.location_of(cluster), exclude)
        clusters.launch(self.parts, s, job, plan, exclude, after, leaving=cluster.id)

    def _from_checkpointing(self, s: Session, job: JobRow, after: AfterCommit) -> None:
        clock = self.parts.clock
        alloc = current_allocation(s, job)
        assert alloc is not None
        cluster = s.get(ClusterRow, alloc.cluster_id)
        assert cluster is not None
        run = self.parts.provisioner.run_status(cluster_info(cluster), job.id, job.attempt)
        if run.phase is RunPhase.SUCCEEDED:
            # It finished inside its notice period: nothing to move.
            end_allocation(alloc, "succeeded", clock.now())
            machine.succeeded(s, clock, job)
            return
        if job.preempted_by is not None:
            self._yield_gpus(s, job, alloc, cluster, after)
            return
        if job.checkpoint_requested_at is not None and open_notice(s, cluster.id, any_state=True) is None:
            # A move the policy chose: go once the job has reported a checkpoint, or its grace ran out.
            if reported_since(s, job, job.checkpoint_requested_at):
                refresh_checkpoint(s, clock, job, cluster.id)
                machine.migrating(s, clock, job, checkpoint=job.checkpoint, reason="checkpoint complete")
            elif grace_over(clock, self.parts.spec_of(job), job.checkpoint_requested_at):
                machine.migrating(s, clock, job, checkpoint=job.checkpoint,
                                  reason="grace ran out with no checkpoint reported")
            return
        notice = open_notice(s, cluster.id, any_state=True)
        if notice is not None:
            record_checkpoint(clock, job, notice)
        now = clock.now()
        # A checkpoint reported since the notice is as good as one the notice carries (a bucket's path on
        # the node may not be what the notice API takes; the report names it relative to the directory).
        reported = notice is not None and reported_since(s, job, noticed_at(clock, notice))
        if reported:
            refresh_checkpoint(s, clock, job, cluster.id)
        checkpointed = notice is not None and (notice.checkpoint is not None or reported)
        deadline_passed = notice is not None and notice.action_time is not None and now >= notice.action_time
        gone = cluster.state not in clusters.HOLDING
        if checkpointed or deadline_passed or gone:
            machine.migrating(s, clock, job, checkpoint=job.checkpoint,
                              reason="checkpoint complete" if checkpointed else "notice deadline reached")

    def _yield_gpus(self, s: Session, job: JobRow, alloc: AllocationRow, cluster: ClusterRow,
                    after: AfterCommit) -> None:
        """A gang preempted inside its cluster: once it has checkpointed (or its grace ran out), stop and requeue."""
        clock = self.parts.clock
        requested = job.checkpoint_requested_at or clock.now()
        if not (reported_since(s, job, requested) or grace_over(clock, self.parts.spec_of(job), requested)):
            return
        after.stops.append((cluster_info(cluster), job.id, job.attempt))
        refresh_checkpoint(s, clock, job, cluster.id)
        close_attempt(job, alloc, clock.now())
        job.preemptions += 1
        job.preempted_by = job.checkpoint_requested_at = None
        machine.requeued(s, clock, job, reason="requeued after yielding its GPUs", checkpoint=job.checkpoint)

    def start_if_ready(self, job_id: str) -> bool:
        """Start the job on its target once the GPUs are up and free (and any old cluster is gone); True
        if the provisioner was called."""
        parts, clock = self.parts, self.parts.clock
        after = AfterCommit()
        with parts.store.transaction() as s:
            job = s.get(JobRow, job_id, with_for_update=True)
            if job is None or job.state not in (JobState.PROVISIONING.value, JobState.MIGRATING.value):
                return False
            target = clusters.target_of(s, job)
            if target is None or target.state != ClusterState.UP.value or job.target_gpus is None:
                return False
            claim = GangPlacement.from_json(target.id, job.target_gpus)
            if packing.claim_still_held(s, job, target.id, claim):
                return False  # the gangs it preempted have not left yet
            previous = current_allocation(s, job)
            if previous is not None and previous.ended_at is None:
                old = s.get(ClusterRow, previous.cluster_id)
                assert old is not None
                if old.state in (*clusters.HOLDING, ClusterState.TERMINATING.value):
                    # Release the old nodes first: two copies of a job must never share a checkpoint dir.
                    clusters.release(old, clock.now(), TeardownReason.REPLACED)
                    after.terminations.append(cluster_info(old))
                else:
                    refresh_checkpoint(s, clock, job, old.id)
                    close_attempt(job, previous, min(old.terminated_at or clock.now(), clock.now()))
                    job.migrations += 1
                    after.starts.append(self._start_on(s, job, target, claim))
            else:
                setup_done = setup_ahead.ready(parts, s, job, target, after)
                if setup_done is not None:  # None: its early setup is still running there
                    after.starts.append(self._start_on(s, job, target, claim, setup_done))
        self._carry_out(after)
        return after.called

    def _start_on(self, s: Session, job: JobRow, target: ClusterRow, placement: GangPlacement,
                  setup_done: bool = False) -> tuple[ClusterInfo, JobLaunch]:
        job.attempt += 1
        now = self.parts.clock.now()
        s.add(AllocationRow(job_id=job.id, cluster_id=target.id, attempt=job.attempt, gpus=placement.to_json(),
                            gpu_share=job.gpu_share, started_at=now, running_at=now))
        job.target_cluster_id = job.target_gpus = job.checkpoint_requested_at = None
        job.zones = [*job.zones, target.zone]
        machine.running(s, self.parts.clock, job, cluster=target.id, zone=target.zone,
                        gpus=placement.to_json(), resume_from=job.checkpoint, attempt=job.attempt)
        return self._job_launch(job, target, placement, setup_done)

    def _job_launch(self, job: JobRow, target: ClusterRow, placement: GangPlacement,
                    setup_done: bool = False) -> tuple[ClusterInfo, JobLaunch]:
        return (cluster_info(target, self.parts.tokens(target.id)),
                setup_ahead.job_launch(self.parts, job, target, placement, job.attempt, setup_done))
