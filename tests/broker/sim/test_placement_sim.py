"""The placement replay: hand-checked timelines, measured-profile slowdowns, and the real Philly traces."""

from __future__ import annotations

from pathlib import Path

import pytest

from broker.sim.placement import simulate
from broker.sim.speed import BandwidthSpeed, ProfileSpeed
from broker.sim.workload import TraceJob, WorkloadError, read_workload
from policies import kinds
from policies.gang import GangPlacement
from policies.placement import ClusterSnapshot, MeasuredSplitCost

TINY = [
    TraceJob("b", 4, 0.0, 50.0, "resnet50"),
    TraceJob("a", 8, 1.0, 100.0, "resnet50"),
    TraceJob("c", 8, 10.0, 100.0, "BERT"),
    TraceJob("big", 32, 20.0, 10.0, "BERT"),
]


def run(policy: str, speed: BandwidthSpeed | ProfileSpeed, jobs: list[TraceJob] = TINY,
        cluster: str = "p4d.24xlarge", nodes: int = 2):
    return simulate(jobs, ClusterSnapshot.empty("c", cluster, nodes), policy, kinds.placement.get(policy), speed)


def test_topology_timeline_by_hand() -> None:
    # b on node 0, a on node 1 (whole), c waits for b (t=50) and runs 100 s; big never fits.
    r = run("topology", BandwidthSpeed())
    assert (r.jobs, r.skipped_jobs, r.splits, r.avoidable_splits) == (3, 1, 0, 0)
    assert r.avg_jct_s == pytest.approx((50 + 100 + 140) / 3)
    assert r.p95_jct_s == pytest.approx(100 + 0.9 * 40)
    assert r.makespan_s == pytest.approx(150)
    assert r.utilization == pytest.approx((4 * 50 + 8 * 100 + 8 * 100) / (16 * 150))
    assert r.stranded_gpus == pytest.approx(4 * 40 / 150)  # node 0's 4 free GPUs while c waits
    assert r.mean_slowdown == 1.0


def test_first_fit_splits_and_pays_the_network() -> None:
    # a lands on node 0 GPUs 4-7 + node 1 GPUs 0-3: its ring falls from NVSwitch (300 GB/s) to
    # EFA (400 Gbit/s = 50 GB/s), so 8.5 % sync becomes 6x slower: 0.915 + 0.085 * 6 = 1.425.
    r = run("first_fit", BandwidthSpeed())
    assert (r.splits, r.avoidable_splits) == (2, 1)
    a_end = 1 + 100 * 1.425
    c_end = 50 + 100 * (0.853 + 0.147 * 6)
    assert r.makespan_s == pytest.approx(c_end)
    assert r.avg_jct_s == pytest.approx((50 + (a_end - 1) + (c_end - 10)) / 3)


def test_bandwidth_model_on_the_dgx1_mesh() -> None:
    speed = BandwidthSpeed()
    snap = ClusterSnapshot.empty("c", "p3.16xlarge", 2)
    nvlink2 = GangPlacement("c", ((0, (0, 3)),))
    pcie = GangPlacement("c", ((0, (0, 6)),))
    split = GangPlacement("c", ((0, (0,)), (1, (0,))))
    assert speed.slowdown("vgg19", 2, nvlink2, snap) == 1.0
    assert speed.slowdown("vgg19", 2, pcie, snap) == pytest.approx(0.915 + 0.085 * 50 / 15.75)
    assert speed.slowdown("vgg19", 2, split, snap) == pytest.approx(0.915 + 0.085 * 50 / (25 / 8))
    assert speed.slowdown("vgg19", 1, GangPlacement("c", ((0, (6,)),)), snap) == 1.0


def write_profile(directory: Path, model: str, rows: list[tuple[int, float, str]]) -> None:
    lines = ["local_bsz,step_time,sync_time,placement"]
    lines += [f"{bsz},{step},0.001,{placement}" for bsz, step, placement in rows]
    (directory / f"{model}_placements-dgx.csv").write_text("\n".join(lines) + "\n")


def test_profile_speed_uses_the_fastest_measured_placement_as_ideal(tmp_path: Path) -> None:
    write_profile(tmp_path, "imagenet", [
        (32, 1.0, "1"), (64, 2.0, "1"),
        (32, 1.1, "8"), (64, 2.2, "8"),  # 8 on one node: 1.1 (same ratio at both batch sizes)
        (32, 1.65, "44"), (64, 3.3, "44"),  # 4 + 4 on two nodes: 1.65
        (32, 1.2, "88"),
    ])
    speed = ProfileSpeed.load(tmp_path)
    snap = ClusterSnapshot.empty("c", "p4d.24xlarge", 3)
    one = GangPlacement("c", ((0, tuple(range(8))),))
    two = GangPlacement("c", ((0, (0, 1, 2, 3)), (1, (0, 1, 2, 3))))
    assert speed.slowdown("resnet50", 8, one, snap) == pytest.approx(1.0)
    assert speed.slowdown("resnet50", 8, two, snap) == pytest.approx(1.5)
    # 24 GPUs on three whole nodes is timed as 8 + 8, and that is also its ideal.
    three = GangPlacement("c", tuple((r, tuple(range(8))) for r in range(3)))
    assert speed.slowdown("vgg19", 24, three, snap) == pytest.approx(1.0)
    with pytest.raises(WorkloadError, match="BERT"):
        speed.slowdown("BERT", 8, one, snap)  # maps to bert, which this directory lacks


def test_profile_speed_never_rewards_spreading_past_two_nodes(tmp_path: Path) -> None:
    write_profile(tmp_path, "imagenet", [
        (32, 1.0, "1"), (32, 1.05, "11"), (32, 1.1, "2"),
        (32, 1.2, "4"), (32, 1.3, "13"), (32, 1.6, "22"),
    ])
    speed = ProfileSpeed.load(tmp_path)
    snap = ClusterSnapshot.empty("c", "p3.16xlarge", 4)
    # four GPUs on four nodes: timed as the slowest measured two-node split of four (2 + 2),
    # not as 1 + 1 (a two-GPU gang's placement, faster than any four-GPU one)
    scattered = GangPlacement("c", tuple((r, (0,)) for r in range(4)))
    assert speed.slowdown("resnet50", 4, scattered, snap) == pytest.approx(1.6 / 1.2)


def test_topology_follows_a_profile_where_spreading_is_faster(tmp_path: Path) -> None:
    write_profile(tmp_path, "imagenet", [(32, 1.0, "1"), (32, 1.5, "8"), (32, 1.0, "44")])
    speed = ProfileSpeed.load(tmp_path)
    assert speed.split_costs("vgg19") == MeasuredSplitCost.of({(1,): 1.0, (8,): 1.5, (4, 4): 1.0})
    assert BandwidthSpeed().split_costs("vgg19") is None
    job = [TraceJob("a", 8, 0.0, 100.0, "resnet50")]
    ours = run("topology", speed, job)
    assert (ours.splits, ours.mean_slowdown, ours.avg_jct_s) == (1, 1.0, pytest.approx(100.0))
    packed = run("packed_sticky", speed, job)
    assert (packed.splits, packed.mean_slowdown, packed.avg_jct_s) == (0, 1.5, pytest.approx(150.0))


def test_workload_errors_name_row_and_field(tmp_path: Path) -> None:
    path = tmp_path / "w.csv"
    path.write_text("job_id,num_gpus,submit_time,duration,model\n1,2,0,10,vgg19\n2,two,0,10,vgg19\n")
    with pytest.raises(WorkloadError, match=r"row 3: num_gpus must be an integer"):
        read_workload(path)
    path.write_text("job_id,num_gpus,submit_time,model\n1,2,0,vgg19\n")
    with pytest.raises(WorkloadError, match=r"missing column.*duration"):
        read_workload(path)


@pytest.mark.traces
@pytest.mark.parametrize("cluster", ["p3.16xlarge", "p4d.24xlarge"])
def test_real_philly_workload_topology_beats_naive_placement(shared_traces: Path, cluster: str) -> None:
    jobs = read_workload(shared_traces / "philly" / "workload-1.csv")
    results = {p: run(p, BandwidthSpeed(), jobs, cluster, 8) for p in ("topology", "first_fit", "random")}
    assert all(r.jobs == 160 and r.skipped_jobs == 0 for r in results.values())
    assert results["topology"].avoidable_splits == 0
    assert results["first_fit"].avoidable_splits > 0
    assert results["topology"].avg_jct_s < results["first_fit"].avg_jct_s
    assert results["topology"].avg_jct_s < results["random"].avg_jct_s


@pytest.mark.traces
def test_real_profiles_cover_every_philly_model(shared_traces: Path) -> None:
    speed = ProfileSpeed.load(shared_traces / "placement-profiles")
    assert set(speed.relative) == {"bert", "cifar10", "deepspeech2", "imagenet", "yolov3"}
    jobs = read_workload(shared_traces / "philly" / "workload-2.csv")
    r = run("topology", speed, jobs, "p3.16xlarge", 8)
    assert r.jobs + r.skipped_jobs == 160 and r.jobs == 160
    assert r.mean_slowdown >= 1.0


@pytest.mark.traces
@pytest.mark.parametrize("profile_set", ["dgx", "azure"])
def test_real_profiles_topology_runs_jobs_closer_to_their_ideal_speed(shared_traces: Path, profile_set: str) -> None:
    speed = ProfileSpeed.load(shared_traces / "placement-profiles", profile_set)
    jobs = read_workload(shared_traces / "philly" / "workload-1.csv")
    results = {p: run(p, speed, jobs, "p3.16xlarge", 8) for p in ("topology", "first_fit", "packed_sticky")}
    assert results["topology"].splits > results["packed_sticky"].splits  # it spreads where measured faster
    assert results["topology"].mean_slowdown < results["first_fit"].mean_slowdown
    assert results["topology"].mean_slowdown < results["packed_sticky"].mean_slowdown
