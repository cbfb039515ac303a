"""A zone's record (what policies avoid) and hazard (what sets the checkpoint interval) count the
clusters the cloud took back, told by their teardown reason, not by the words of a backend's message."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

from broker.engine.cadence import zone_hazard
from broker.engine.planning import fitting, zone_records
from broker.model import ClusterState, TeardownReason
from broker.spec.job import parse_job_spec
from broker.store import open_store
from broker.store.tables import ClusterRow
from policies.checkpointing import DEFAULT_PRIOR_UPTIME_S
from providers.local import LocalMarket
from providers.trace import read_trace

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


# --- instance_type named with accelerators ------------------------------------------------------

QUICKSTART = Path(__file__).resolve().parents[3] / "broker" / "data" / "quickstart-market.csv"
MARKET_START = datetime(2026, 1, 5, 9, tzinfo=UTC)


def _placeable(text: str) -> tuple[set[str], bool]:
    """The instance types the bundled market's quotes offer the job, and whether they are exact sizes."""
    spec = parse_job_spec(text, source="job.yaml", offline=True)
    quotes = LocalMarket(read_trace(QUICKSTART), MARKET_START).quotes(MARKET_START)
    offers, exact = fitting(spec, quotes)
    return {q.instance_type for q in offers}, exact


def test_a_job_naming_instance_type_and_accelerators_lands_only_on_that_type() -> None:
    assert _placeable("run: x\nresources:\n  accelerators: A100:2\n  instance_type: a2-highgpu-2g\n") == \
        ({"a2-highgpu-2g"}, True)
    # A share of one GPU: without the type it would take the one-GPU a2-highgpu-1g, where nothing is shared.
    assert _placeable("run: x\nresources:\n  accelerators: A100:0.5\n") == ({"a2-highgpu-1g"}, True)
    assert _placeable("run: x\nresources:\n  accelerators: A100:0.5\n  instance_type: a2-highgpu-2g\n") == \
        ({"a2-highgpu-2g"}, False)


def test_a_mixed_file_keeps_the_alternative_without_a_type_placeable_anywhere() -> None:
    tied_and_free = ("run: x\nresources:\n  any_of:\n    - {accelerators: A100:2, instance_type: a2-highgpu-2g}\n"
                     "    - {accelerators: H100:1}\n")
    types, exact = _placeable(tied_and_free)
    assert exact and "a2-highgpu-2g" in types and {"a3-highgpu-1g", "p5.4xlarge"} <= types
    assert not types & {"a2-highgpu-1g", "a2-highgpu-4g", "Standard_ND96asr_v4", "p4d.24xlarge"}
    # The same accelerator tied in one alternative and free in another is free: any A100:2 node.
    same = ("run: x\nresources:\n  ordered:\n    - {accelerators: A100:2, instance_type: a2-highgpu-2g}\n"
            "    - {accelerators: A100:2}\n")
    spec = parse_job_spec(same, source="job.yaml", offline=True)
    assert [(a.name, a.count, a.instance_types) for a in spec.accelerators] == [("A100", 2, ())]
