"""``broker simulate-placement`` and ``broker show-topology`` end to end, through the real entry point."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.broker.cli.running import run_cli as run

TINY = """job_id,num_gpus,submit_time,duration,model
b,4,0,50,resnet50
a,8,1,100,resnet50
c,8,10,100,BERT
big,32,20,10,BERT
"""




@pytest.fixture
def tiny(tmp_path: Path) -> Path:
    path = tmp_path / "jobs.csv"
    path.write_text(TINY)
    return path


def test_json_report_with_hand_checked_numbers(tiny: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(["simulate-placement", "--workload", str(tiny), "--cluster", "2xp4d.24xlarge",
                        "--policy", "topology,first_fit", "--json"], capsys)
    assert code == 0
    report = json.loads(out)
    assert list(report) == ["topology", "first_fit"]
    ours = report["topology"]
    for key in ("avg_jct_s", "p95_jct_s", "makespan_s", "utilization", "stranded_gpus", "avoidable_splits",
                "decision_ms_median"):
        assert key in ours
    # b (4 GPUs) on node 0, a (8) on node 1, c waits until b ends at 50 and runs to 150; big skipped.
    assert ours["avg_jct_s"] == pytest.approx(290 / 3)
    assert ours["makespan_s"] == pytest.approx(150)
    assert ours["utilization"] == pytest.approx(0.75)
    assert ours["skipped_jobs"] == 1
    assert (ours["splits"], ours["avoidable_splits"]) == (0, 0)
    assert report["first_fit"]["avoidable_splits"] == 1
    assert report["first_fit"]["avg_jct_s"] > ours["avg_jct_s"]


def test_table_lists_every_policy_and_the_skipped_job(tiny: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(["simulate-placement", "--workload", str(tiny), "--cluster", "2xp4d.24xlarge"], capsys)
    assert code == 0
    for name in ("topology", "first_fit", "random", "packed_sticky"):
        assert name in out
    assert "skipped 1 job(s)" in err


def test_measured_profiles_drive_the_speed(tiny: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    profiles = tmp_path / "profiles"
    profiles.mkdir()
    rows = ["local_bsz,step_time,sync_time,placement", "32,1.0,0,1", "32,1.0,0,4", "32,1.5,0,8", "32,2.0,0,44",
            "32,1.0,0,88"]
    for model in ("imagenet", "bert"):
        (profiles / f"{model}_placements-dgx.csv").write_text("\n".join(rows) + "\n")
    code, out, _ = run(["simulate-placement", "--workload", str(tiny), "--cluster", "2xp4d.24xlarge",
                        "--policy", "first_fit", "--profiles", str(profiles), "--json"], capsys)
    assert code == 0
    ff = json.loads(out)["first_fit"]
    # 8 GPUs on one node step in 1.5 x the 1-GPU time, split 4+4 in 2.0 x: a split runs 4/3 slower.
    # a: 1 -> 1 + 100 * 4/3; c: placed at 50 on 4+4 -> 50 + 100 * 4/3.
    assert ff["makespan_s"] == pytest.approx(50 + 400 / 3)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--cluster", "eight-p3"], "--cluster must look like"),
        (["--cluster", "8xp9.huge"], "no GPU topology for instance type 'p9.huge'"),
        (["--policy", "best"], "unknown placement policy best"),
        (["--profiles", "/nonexistent-profiles"], "not a directory"),
    ],
)
def test_bad_options_exit_2_naming_the_option(tiny: Path, capsys: pytest.CaptureFixture[str], args: list[str],
                                              message: str) -> None:
    argv = ["simulate-placement", "--workload", str(tiny), "--cluster", "2xp4d.24xlarge", *args]
    code, _, err = run(argv, capsys)
    assert code == 2
    assert message in err


def test_bad_workload_exits_2_naming_row_and_field(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "bad.csv"
    path.write_text("job_id,num_gpus,submit_time,duration,model\n1,2,0,10,vgg19\n2,2,0,10,alexnet\n")
    code, _, err = run(["simulate-placement", "--workload", str(path), "--cluster", "1xp3.16xlarge"], capsys)
    assert code == 2 and "model 'alexnet' has no speed profile" in err
    path.write_text("job_id,num_gpus,submit_time,duration,model\n1,0,0,10,vgg19\n")
    code, _, err = run(["simulate-placement", "--workload", str(path), "--cluster", "1xp3.16xlarge"], capsys)
    assert code == 2 and "row 2: num_gpus must be at least 1" in err
    code, _, err = run(["simulate-placement", "--workload", str(tmp_path / "missing.csv"), "--cluster",
                        "1xp3.16xlarge"], capsys)
    assert code == 2 and "cannot read workload" in err


def test_show_topology_prints_the_dgx1_mesh(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(["show-topology", "p3.16xlarge", "--json"], capsys)
    assert code == 0
    topo = json.loads(out)
    assert topo["link_kind"][0][6] == "pcie" and topo["link_gb_s"][0][3] == 50.0
    assert topo["network_gbit_s"] == 25
    code, _, err = run(["show-topology", "p9.huge"], capsys)
    assert code == 2 and "p9.huge" in err
