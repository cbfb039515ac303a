"""Cluster lifecycle: every state change through the transition table, sync with what the local
backend says, the fleet's GPUs, the once-per-spell limit events, the launch row, release and reap."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Collection, Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select

from broker.backends.local.host import process_alive, read_json
from broker.clock import AcceleratedClock
from broker.engine import clusters
from broker.engine.clusters import CLUSTER_TRANSITIONS, IllegalClusterTransition
from broker.engine.parts import AfterCommit, Parts
from broker.model import LIVE_CLUSTER_STATES, ClusterState, JobState, TeardownReason
from broker.store import Store, open_store
from broker.store.tables import AllocationRow, ClusterRow, JobEventRow, JobRow, NoticeRow
from broker.tokens import token_digest
from policies.selection import IDLE, ON_DEMAND, Location, Plan, ZoneOffer
from tests.broker.engine.store_rows import (
    T0,
    add,
    get,
    make_parts,
    new_allocation,
    new_cluster,
    set_job,
    submitted,
)

OFFER = ZoneOffer("aws", "us-east-1", "us-east-1a", "p3.8xlarge", "V100", 4, 3.67, 12.24, 4)
OTHER = ZoneOffer("aws", "us-east-1", "us-east-1b", "p3.8xlarge", "V100", 4, 3.10, 12.24, 4)
STATES = list(ClusterState)
# The lifecycle as designed, written out here so that a change to the module's table shows up as a
# failing test: PROVISIONING -> UP -> TERMINATING -> TERMINATED, or FAILED; a launch abandoned while
# coming up; the cloud ending a cluster at any point of its life.
P, U, T, X, F = (ClusterState.PROVISIONING, ClusterState.UP, ClusterState.TERMINATING, ClusterState.TERMINATED,
                 ClusterState.FAILED)
LEGAL = {(P, U), (P, F), (P, T), (P, X), (U, T), (U, X), (U, F), (T, X), (T, F)}


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    opened = open_store(f"sqlite:///{tmp_path / 'store.db'}")
    yield opened
    opened.dispose()


@pytest.fixture
def db_store(db_url: str) -> Iterator[Store]:
    """On SQLite and PostgreSQL, for what this module asks of SQL itself (sums, JSON compared, joins)."""
    opened = open_store(db_url)
    yield opened
    opened.dispose()


def _wall_parts(store: Store, home: Path, **options: Any) -> Parts:
    """Parts whose market clock runs with the wall's, so a backend's wall stamps read back as themselves."""
    return make_parts(store, home, AcceleratedClock(time.time(), 1.0), **options)


def _host_says(parts: Parts, cluster_id: str, **status: Any) -> Path:
    """The state files a local cluster's host writes: its config, and its status (held by this process)."""
    directory = parts.options.home / "local" / "clusters" / cluster_id
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "cluster.json").write_text(json.dumps({"cluster_id": cluster_id}))
    (directory / "status.json").write_text(json.dumps({"host_pid": os.getpid(), **status}))
    return directory


def _cluster(store: Store, cluster_id: str) -> ClusterRow:
    with store.transaction() as s:
        row = get(s, ClusterRow, cluster_id)
        s.expunge(row)
        return row


def _events(store: Store, job_id: str, *kinds: str) -> list[JobEventRow]:
    with store.transaction() as s:
        rows = list(s.scalars(select(JobEventRow).where(JobEventRow.job_id == job_id, JobEventRow.kind.in_(kinds))
                              .order_by(JobEventRow.id)))
        s.expunge_all()
        return rows


# ----------------------------------------------------------------------------- the transition table


def test_the_table_names_every_state_and_the_ended_states_lead_nowhere() -> None:
    assert set(CLUSTER_TRANSITIONS) == set(ClusterState)
    assert CLUSTER_TRANSITIONS[ClusterState.TERMINATED] == frozenset()
    assert CLUSTER_TRANSITIONS[ClusterState.FAILED] == frozenset()
    assert ClusterState.PROVISIONING not in set().union(*CLUSTER_TRANSITIONS.values())  # nothing goes back
    assert {s.value for s in CLUSTER_TRANSITIONS if CLUSTER_TRANSITIONS[s]} == set(LIVE_CLUSTER_STATES)


@pytest.mark.parametrize(("source", "target"), [(a, b) for a in STATES for b in STATES])
def test_every_legal_change_is_made_and_every_other_is_refused(source: ClusterState, target: ClusterState) -> None:
    row = new_cluster("c1", source)
    assert (target in CLUSTER_TRANSITIONS[source]) == ((source, target) in LEGAL)
    if (source, target) in LEGAL:
        clusters._move(row, target)
        assert row.state == target.value
    else:
        with pytest.raises(IllegalClusterTransition, match=f"cluster c1 cannot move from {source} to {target}"):
            clusters._move(row, target)
        assert row.state == source.value


# ----------------------------------------------------------------------------- release


@pytest.mark.parametrize("source", [ClusterState.PROVISIONING, ClusterState.UP])
def test_release_marks_a_live_cluster_terminating_with_when_and_why(source: ClusterState) -> None:
    row = new_cluster("c1", source)
    clusters.release(row, T0, TeardownReason.REPLACED)
    assert (row.state, row.terminate_at, row.teardown_reason) == ("TERMINATING", T0, "replaced")
    clusters.release(row, T0 + timedelta(minutes=5), TeardownReason.IDLE)  # already going: nothing changes
    assert (row.state, row.terminate_at, row.teardown_reason) == ("TERMINATING", T0, "replaced")


@pytest.mark.parametrize("source", [ClusterState.TERMINATED, ClusterState.FAILED])
def test_release_of_an_ended_cluster_is_refused(source: ClusterState) -> None:
    row = new_cluster("c1", source, teardown_reason="cloud")
    with pytest.raises(IllegalClusterTransition):
        clusters.release(row, T0, TeardownReason.IDLE)
    assert (row.state, row.teardown_reason, row.terminate_at) == (source.value, "cloud", None)


# ----------------------------------------------------------------------------- sync


def test_sync_moves_a_provisioning_cluster_up_when_its_host_says_so(store: Store, broker_home: Path) -> None:
    parts = _wall_parts(store, broker_home)
    add(store, new_cluster("c1", ClusterState.PROVISIONING, handle={"kept": 1}))
    up_wall = time.time() - 30.0
    directory = _host_says(parts, "c1", state="UP", up_wall=up_wall, metadata_port=4242)
    clusters.sync(parts)
    row = _cluster(store, "c1")
    assert row.state == "UP" and row.teardown_reason is None
    assert row.up_at is not None and abs((row.up_at - parts.clock.to_clock(up_wall)).total_seconds()) < 1e-3
    assert row.handle == {"kept": 1, "metadata_port": 4242, "dir": str(directory)}
    clusters.sync(parts)  # nothing new: nothing changes
    assert _cluster(store, "c1").up_at == row.up_at


def test_sync_records_a_launch_the_backend_refused_as_failed(store: Store, broker_home: Path) -> None:
    parts = _wall_parts(store, broker_home)
    job_id = submitted(store, broker_home)
    add(store, new_cluster("c1", ClusterState.PROVISIONING, job_id=job_id))
    _host_says(parts, "c1", state="FAILED", reason="InsufficientInstanceCapacity", capacity_error=True)
    clusters.sync(parts)
    row = _cluster(store, "c1")
    assert (row.state, row.teardown_reason, row.reason) == ("FAILED", "launch_failed", "InsufficientInstanceCapacity")
    assert row.terminated_at is not None
    (event,) = _events(store, job_id, "launch_failed")
    assert event.detail == {"cluster": "c1", "zone": "us-east-1a", "reason": "InsufficientInstanceCapacity",
                            "capacity": True}


def test_sync_ends_a_cluster_the_cloud_took_back_at_the_moment_it_ended(store: Store,
                                                                        broker_home: Path) -> None:
    parts = _wall_parts(store, broker_home)
    add(store, new_cluster("c1", ClusterState.UP))
    ended_wall = time.time() - 60.0
    _host_says(parts, "c1", state="TERMINATED", reason="spot capacity reclaimed", ended_wall=ended_wall)
    clusters.sync(parts)
    row = _cluster(store, "c1")
    assert (row.state, row.teardown_reason, row.reason) == ("TERMINATED", "cloud", "spot capacity reclaimed")
    assert row.terminated_at is not None
    assert abs((row.terminated_at - parts.clock.to_clock(ended_wall)).total_seconds()) < 1e-3


def test_sync_keeps_the_reason_a_cluster_was_torn_down_for(store: Store, broker_home: Path) -> None:
    parts = _wall_parts(store, broker_home)
    add(store, new_cluster("c1", ClusterState.TERMINATING, teardown_reason="idle", reason="no job"))
    _host_says(parts, "c1", state="UP", up_wall=time.time())
    clusters.sync(parts)  # still up while it goes: it stays TERMINATING
    assert _cluster(store, "c1").state == "TERMINATING"
    _host_says(parts, "c1", state="TERMINATED", reason="terminated on request", ended_wall=time.time())
    clusters.sync(parts)
    row = _cluster(store, "c1")
    assert (row.state, row.teardown_reason, row.reason) == ("TERMINATED", "idle", "no job")


def test_a_live_cluster_the_backend_never_heard_of_is_gone(store: Store, broker_home: Path) -> None:
    parts = _wall_parts(store, broker_home)
    add(store, new_cluster("c1", ClusterState.UP, up_at=None))
    clusters.sync(parts)
    row = _cluster(store, "c1")
    assert (row.state, row.teardown_reason) == ("TERMINATED", "cloud")
    assert row.terminated_at is not None and row.up_at == row.terminated_at  # never seen up: a zero-length life


def test_sync_leaves_ended_clusters_alone(store: Store, broker_home: Path) -> None:
    parts = _wall_parts(store, broker_home)
    add(store, new_cluster("gone", ClusterState.TERMINATED, teardown_reason="idle", terminated_at=T0),
        new_cluster("refused", ClusterState.FAILED, teardown_reason="launch_failed", terminated_at=T0))
    _host_says(parts, "gone", state="UP", up_wall=time.time())
    clusters.sync(parts)
    assert [_cluster(store, c).state for c in ("gone", "refused")] == ["TERMINATED", "FAILED"]
    assert not (broker_home / "local" / "clusters" / "refused").exists()  # never launched again


def test_a_notice_the_backend_saw_is_recorded_once(store: Store, broker_home: Path) -> None:
    parts = _wall_parts(store, broker_home)
    add(store, new_cluster("c1", ClusterState.UP))
    action_wall = float(int(time.time()) + 120)
    _host_says(parts, "c1", state="UP", up_wall=time.time(), notice_action_wall=action_wall)
    clusters.sync(parts)
    clusters.sync(parts)
    with store.transaction() as s:
        notices = list(s.scalars(select(NoticeRow)))
        assert [(n.cluster_id, n.kind, n.source, n.dedup_key) for n in notices] == [
            ("c1", "terminate", "backend", "c1:terminate")]
        action_time = notices[0].action_time
        assert action_time is not None and abs((action_time - parts.clock.to_clock(action_wall)).total_seconds()) < 1e-3
    assert _cluster(store, "c1").state == "UP"


def test_a_cluster_written_but_never_launched_is_launched_on_the_next_sync(store: Store,
                                                                           broker_home: Path) -> None:
    """The engine crashed between writing the row and asking for the launch: sync asks for it."""
    parts = _wall_parts(store, broker_home)
    add(store, new_cluster("c1", ClusterState.PROVISIONING))
    directory = broker_home / "local" / "clusters" / "c1"
    clusters.sync(parts)
    try:
        config = read_json(directory / "cluster.json")
        assert config is not None and config["cluster_id"] == "c1" and config["key"]["zone"] == "us-east-1a"
        assert _cluster(store, "c1").state == "PROVISIONING"  # coming up, not yet up
    finally:
        (directory / "terminate").touch()
        deadline = time.time() + 60
        while time.time() < deadline:
            status = read_json(directory / "status.json") or {}
            if status.get("state") == "TERMINATED" and not process_alive(status.get("host_pid")):
                break
            time.sleep(0.05)
        else:
            raise AssertionError("the relaunched host did not stop")


# ----------------------------------------------------------------------------- fleet_gpus


def test_fleet_gpus_count_clusters_up_or_coming_up_less_those_leaving(db_store: Store) -> None:
    with db_store.transaction() as s:
        assert clusters.fleet_gpus(s) == 0
    add(db_store, new_cluster("up", ClusterState.UP, num_nodes=2),
        new_cluster("coming", ClusterState.PROVISIONING, gpus_per_node=8, instance_type="p3.16xlarge"),
        new_cluster("going", ClusterState.TERMINATING), new_cluster("gone", ClusterState.TERMINATED),
        new_cluster("refused", ClusterState.FAILED))
    with db_store.transaction() as s:
        assert clusters.fleet_gpus(s) == 2 * 4 + 8
        assert clusters.fleet_gpus(s, "up") == 8
        assert clusters.fleet_gpus(s, ["up", "coming"]) == 0
        assert clusters.fleet_gpus(s, {"gone", "nothere"}) == 16
        assert clusters.fleet_gpus(s, []) == 16


# ----------------------------------------------------------------------------- blocked


def test_a_limit_is_recorded_once_per_spell(db_store: Store, broker_home: Path) -> None:
    parts = make_parts(db_store, broker_home)
    job_id = submitted(db_store, broker_home)

    def hold(kind: str, **detail: object) -> None:
        with db_store.transaction() as s:
            clusters.record_blocked(parts, s, get(s, JobRow, job_id), kind, **detail)

    hold("fleet_full", max_gpus=8)
    hold("fleet_full", max_gpus=8)  # still waiting for the same reason: nothing new
    hold("fleet_full", max_gpus=12)  # the limit changed: a new spell
    hold("queue_full", queue_max_gpus=4)  # held back by something else
    hold("queue_full", queue_max_gpus=4)
    with db_store.transaction() as s:
        parts.event(s, job_id, "launch", cluster="c1")
    hold("queue_full", queue_max_gpus=4)  # launched since: a new spell
    kinds = [(e.kind, e.detail) for e in _events(db_store, job_id, "fleet_full", "queue_full", "launch")]
    assert kinds == [("fleet_full", {"max_gpus": 8}), ("fleet_full", {"max_gpus": 12}),
                     ("queue_full", {"queue_max_gpus": 4}), ("launch", {"cluster": "c1"}),
                     ("queue_full", {"queue_max_gpus": 4})]


# ----------------------------------------------------------------------------- launch


def _launch(store: Store, parts: Parts, job_id: str, plan: Plan, exclude: Collection[str] = (),
            leaving: str | None = None) -> tuple[str | None, AfterCommit]:
    after = AfterCommit()
    with store.transaction() as s:
        row = clusters.launch(parts, s, get(s, JobRow, job_id), plan, set(exclude), after, leaving=leaving)
        return (row.id if row is not None else None), after


def test_launch_writes_the_row_for_the_first_usable_location_and_defers_the_call(db_store: Store,
                                                                                 broker_home: Path) -> None:
    parts = make_parts(db_store, broker_home)
    job_id = submitted(db_store, broker_home)
    plan = Plan((Location(IDLE), Location("spot", OFFER), Location("spot", OTHER)), "cheapest")
    cluster_id, after = _launch(db_store, parts, job_id, plan, exclude={OFFER.location})
    assert cluster_id == f"{job_id}-c1"
    row = _cluster(db_store, cluster_id)
    assert (row.state, row.zone, row.spot, row.price_per_node_hour, row.num_nodes, row.gpus_per_node) == (
        "PROVISIONING", "us-east-1b", True, 3.10, 1, 4)
    assert row.token_hash == token_digest(f"token-{cluster_id}") and row.launch_key == f"{job_id}:1"
    launched = [(i.id, i.zone, i.agent_token) for i in after.launches]
    assert launched == [(cluster_id, "us-east-1b", f"token-{cluster_id}")]
    assert not (broker_home / "local" / "clusters" / cluster_id).exists()  # launched only after commit
    with db_store.transaction() as s:
        job = get(s, JobRow, job_id)
        assert job.target_cluster_id == cluster_id and job.target_gpus == {"0": [0, 1, 2, 3]}
    (event,) = _events(db_store, job_id, "launch")
    assert event.detail == {"cluster": cluster_id, "zone": "us-east-1b", "cloud": "aws", "spot": True,
                            "price": 3.10, "reason": "cheapest"}
    second, _ = _launch(db_store, parts, job_id, Plan((Location("spot", OFFER),)))
    assert second == f"{job_id}-c2"


def test_an_excluded_zone_still_serves_on_demand(store: Store, broker_home: Path) -> None:
    parts = make_parts(store, broker_home)
    job_id = submitted(store, broker_home)
    cluster_id, _ = _launch(store, parts, job_id, Plan((Location(ON_DEMAND, OFFER),)), exclude={OFFER.location})
    assert cluster_id is not None
    row = _cluster(store, cluster_id)
    assert (row.spot, row.price_per_node_hour) == (False, 12.24)


def test_a_plan_with_nothing_usable_launches_nothing(store: Store, broker_home: Path) -> None:
    parts = make_parts(store, broker_home)
    job_id = submitted(store, broker_home)
    plan = Plan((Location(IDLE), Location(ON_DEMAND), Location("spot", OFFER)))
    cluster_id, after = _launch(store, parts, job_id, plan, exclude={OFFER.location})
    assert cluster_id is None and after.launches == []
    with store.transaction() as s:
        assert s.scalar(select(ClusterRow.id)) is None
        assert get(s, JobRow, job_id).target_cluster_id is None


def test_a_launch_past_the_fleet_limit_waits_unless_the_gpus_leave(db_store: Store, broker_home: Path) -> None:
    parts = make_parts(db_store, broker_home, max_gpus=8)
    job_id = submitted(db_store, broker_home)
    add(db_store, new_cluster("old", ClusterState.UP, num_nodes=2))  # 8 GPUs held already
    cluster_id, after = _launch(db_store, parts, job_id, Plan((Location("spot", OFFER),)))
    assert cluster_id is None and after.launches == []
    assert [e.detail for e in _events(db_store, job_id, "fleet_full")] == [{"max_gpus": 8}]
    moved, _ = _launch(db_store, parts, job_id, Plan((Location("spot", OFFER),)), leaving="old")  # a migration frees it
    assert moved is not None


def test_a_launch_past_its_queue_limit_waits(db_store: Store, broker_home: Path) -> None:
    parts = make_parts(db_store, broker_home, queue_max_gpus=(("training", 4),))
    first = submitted(db_store, broker_home)
    assert _launch(db_store, parts, first, Plan((Location("spot", OFFER),)))[0] is not None
    second = submitted(db_store, broker_home)
    assert _launch(db_store, parts, second, Plan((Location("spot", OTHER),)))[0] is None
    assert [e.detail for e in _events(db_store, second, "queue_full")] == [{"queue_max_gpus": 4}]


# ----------------------------------------------------------------------------- target_of


def test_target_of_is_the_cluster_the_job_heads_to_while_it_is_live(store: Store, broker_home: Path) -> None:
    job_id = submitted(store, broker_home)
    add(store, new_cluster("c1", ClusterState.PROVISIONING))
    with store.transaction() as s:
        job = get(s, JobRow, job_id)
        assert clusters.target_of(s, job) is None
        job.target_cluster_id = "c1"
        target = clusters.target_of(s, job)
        assert target is not None and target.id == "c1"
        get(s, ClusterRow, "c1").state = ClusterState.UP.value
        assert clusters.target_of(s, job) is target
        for state in (ClusterState.TERMINATING, ClusterState.TERMINATED, ClusterState.FAILED):
            get(s, ClusterRow, "c1").state = state.value
            assert clusters.target_of(s, job) is None
        job.target_cluster_id = "nothere"
        assert clusters.target_of(s, job) is None


# ----------------------------------------------------------------------------- reap


def test_reap_tears_down_what_nobody_holds_and_keeps_what_a_job_holds(store: Store, broker_home: Path) -> None:
    parts = make_parts(store, broker_home)
    running, heading, done = (submitted(store, broker_home) for _ in range(3))
    set_job(store, running, state=JobState.RUNNING.value, attempt=1)
    set_job(store, heading, state=JobState.PROVISIONING.value, target_cluster_id="target",
            target_gpus={"0": [0, 1, 2, 3]})
    set_job(store, done, state=JobState.SUCCEEDED.value, attempt=1)
    add(store, new_cluster("held", ClusterState.UP), new_cluster("target", ClusterState.PROVISIONING),
        new_cluster("idle", ClusterState.UP), new_cluster("finished", ClusterState.UP),
        new_allocation(running, "held", running_at=T0), new_allocation(done, "finished", running_at=T0))
    idle_dir = _host_says(parts, "idle", state="UP")
    clusters.reap(parts)
    states = {c: (_cluster(store, c).state, _cluster(store, c).teardown_reason)
              for c in ("held", "target", "idle", "finished")}
    assert states == {"held": ("UP", None), "target": ("PROVISIONING", None), "idle": ("TERMINATING", "idle"),
                      "finished": ("TERMINATING", "idle")}
    assert (idle_dir / "terminate").exists()  # asked of the backend after commit
    with store.transaction() as s:
        allocs = {a.job_id: (a.ended_at, a.outcome) for a in s.scalars(select(AllocationRow))}
    assert allocs == {running: (None, None), done: (parts.clock.now(), "succeeded")}


def test_reap_keeps_an_idle_cluster_for_the_pool_while_nothing_waits(store: Store, broker_home: Path) -> None:
    parts = make_parts(store, broker_home, pool_idle_s=600.0)
    add(store, new_cluster("fresh", ClusterState.UP, up_at=T0 - timedelta(seconds=60)),
        new_cluster("stale", ClusterState.UP, up_at=T0 - timedelta(seconds=900)))
    clusters.reap(parts)
    assert (_cluster(store, "fresh").state, _cluster(store, "stale").state) == ("UP", "TERMINATING")
    submitted(store, broker_home)  # a queued job: the pool gives the cluster up
    clusters.reap(parts)
    assert _cluster(store, "fresh").state == "TERMINATING"


def test_reap_asks_again_for_every_cluster_still_terminating(store: Store, broker_home: Path) -> None:
    parts = make_parts(store, broker_home)
    add(store, new_cluster("going", ClusterState.TERMINATING, teardown_reason="replaced"))
    directory = _host_says(parts, "going", state="UP")
    clusters.reap(parts)
    assert (directory / "terminate").exists()
    assert _cluster(store, "going").teardown_reason == "replaced"

