"""A zone's record (what policies avoid) and hazard (what sets the checkpoint interval) count the
clusters the cloud took back, told by their teardown reason, not by the words of a backend's message."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from broker.engine.cadence import zone_hazard
from broker.engine.planning import zone_records
from broker.model import ClusterState, TeardownReason
from broker.store import open_store
from broker.store.tables import ClusterRow
from policies.checkpointing import DEFAULT_PRIOR_UPTIME_S

T0 = datetime(2026, 1, 1, 12, tzinfo=UTC)
KEY = "aws/us-east-1a/p3.2xlarge"


def _cluster(name: str, state: ClusterState, why: TeardownReason | None, reason: str) -> ClusterRow:
    return ClusterRow(id=name, launch_key=name, backend="local", cloud="aws", region="us-east-1", zone="us-east-1a",
                      instance_type="p3.2xlarge", accelerator="V100", gpus_per_node=1, num_nodes=1, spot=True,
                      price_per_node_hour=0.9, on_demand_price_per_node_hour=3.06, state=state.value,
                      teardown_reason=why.value if why else None, reason=reason, handle={}, created_at=T0,
                      up_at=T0, terminated_at=T0 + timedelta(hours=1))


def test_only_clusters_the_cloud_ended_count_as_preemptions_and_failed_launches_as_refusals(db_url: str) -> None:
    store = open_store(db_url)
    try:
        with store.transaction() as s:
            # The backend's words differ from cloud to cloud; the reason column says what happened.
            s.add(_cluster("taken", ClusterState.TERMINATED, TeardownReason.CLOUD, "node lost"))
            s.add(_cluster("idle", ClusterState.TERMINATED, TeardownReason.IDLE, "no job reclaimed it"))
            s.add(_cluster("moved", ClusterState.TERMINATED, TeardownReason.REPLACED, "spot capacity reclaimed"))
            s.add(_cluster("refused", ClusterState.FAILED, TeardownReason.LAUNCH_FAILED, "InsufficientCapacity"))
        with store.transaction() as s:
            record = zone_records(s)[KEY]
            assert record.preemptions == (T0 + timedelta(hours=1),)
            assert record.failed_launches == (T0 + timedelta(hours=1),)
            cluster = s.get(ClusterRow, "taken")
            assert cluster is not None
            hazard = zone_hazard(s, cluster, T0 + timedelta(hours=2))
            # GCP says a spot VM there runs two hours: that is the prior's one preemption's worth.
            told = zone_hazard(s, cluster, T0 + timedelta(hours=2), prior_uptime=7200.0)
        spot_seconds = 4 * 3600.0  # four clusters each up an hour
        assert hazard == (1 + 1) / (spot_seconds + DEFAULT_PRIOR_UPTIME_S)
        assert told == (1 + 1) / (spot_seconds + 7200.0)
    finally:
        store.dispose()
