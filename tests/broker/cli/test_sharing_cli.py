"""``broker simulate-placement --nodes``: the GPU-sharing replay end to end through the real entry point."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.broker.cli.running import run_cli as run

ROOT = Path(__file__).resolve().parents[3]

NODES = "sn,cpu_milli,memory_mib,gpu,model\nn0,8000,32768,2,T4\nn1,8000,32768,2,T4\nn2,4000,16384,1,P100\n"
PODS = ("name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos\n"
        "a,1000,1024,1,500,,LS\nb,1000,1024,1,500,,LS\nc,2000,2048,1,1000,,BE\nd,500,512,0,0,,BE\n"
        "e,1000,1024,2,1000,T4,LS\nf,1000,1024,1,250,,LS\n")




@pytest.fixture
def files(tmp_path: Path) -> tuple[Path, Path]:
    nodes, pods = tmp_path / "nodes.csv", tmp_path / "pods.csv"
    nodes.write_text(NODES)
    pods.write_text(PODS)
    return pods, nodes


def test_json_has_exactly_the_promised_shape(files: tuple[Path, Path], capsys: pytest.CaptureFixture[str]) -> None:
    pods, nodes = files
    code, out, _ = run(["simulate-placement", "--workload", str(pods), "--nodes", str(nodes), "--seed", "3",
                        "--json"], capsys)
    assert code == 0
    report = json.loads(out)
    assert set(report) == {"default_policy", "policies"}
    assert report["default_policy"] == "fgd"
    assert next(iter(report["policies"])) == "fgd"
    assert set(report["policies"]) == {"fgd", "first_fit", "best_fit", "dot_product", "gpu_packing",
                                       "gpu_clustering", "random"}
    for figures in report["policies"].values():
        assert set(figures) == {"curve", "unallocated_gpu_pct", "allocated_gpu_pct", "failed_tasks",
                                "decision_ms_p50"}
        assert [p["arrived_pct"] for p in figures["curve"]] == list(range(10, 140, 10))
        assert set(figures["curve"][0]) == {"arrived_pct", "unallocated_gpu_pct"}
        assert figures["unallocated_gpu_pct"] == pytest.approx(100 - figures["allocated_gpu_pct"])
        assert figures["curve"][-1]["unallocated_gpu_pct"] == figures["unallocated_gpu_pct"]
        assert 0 <= figures["allocated_gpu_pct"] <= 100
    # The same seed gives the same replay.
    again = json.loads(run(["simulate-placement", "--workload", str(pods), "--nodes", str(nodes), "--seed", "3",
                            "--policy", "fgd", "--json"], capsys)[1])
    assert again["policies"]["fgd"]["curve"] == report["policies"]["fgd"]["curve"]


def test_table_and_plot(files: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pods, nodes = files
    png = tmp_path / "curves.png"
    code, out, _ = run(["simulate-placement", "--workload", str(pods), "--nodes", str(nodes),
                        "--policy", "fgd,best_fit", "--until", "1.0", "--plot", str(png)], capsys)
    assert code == 0
    assert "fgd" in out and "best_fit" in out and "@100%" in out
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize(("extra", "message"), [
    (["--policy", "best"], "--policy: unknown sharing policy best"),
    (["--until", "0"], "--until must be between"),
    (["--until", "nan"], "--until must be between"),
    (["--until", "1e9"], "--until must be between"),
    (["--seed", "-1"], "--seed must be between"),
    (["--plot", "x.pdf"], "--plot must name a .png file"),
    (["--cluster", "2xp4d.24xlarge"], "takes neither --cluster nor --profiles"),
])
def test_bad_flags_are_one_line_and_exit_2(files: tuple[Path, Path], capsys: pytest.CaptureFixture[str],
                                           extra: list[str], message: str) -> None:
    pods, nodes = files
    code, out, err = run(["simulate-placement", "--workload", str(pods), "--nodes", str(nodes), *extra], capsys)
    assert code == 2
    assert message in err
    assert "Traceback" not in err + out


@pytest.mark.parametrize(("which", "text", "message"), [
    ("nodes", "garbage\x01\n", "missing column(s)"),
    ("nodes", "sn,cpu_milli,memory_mib,gpu,model\nn0,lots,1,1,T4\n", "row 2: cpu_milli: expected a whole number"),
    ("nodes", "sn,cpu_milli,memory_mib,gpu,model\nn0,1000,1,1000000,T4\n", "row 2: gpu: 1000000 is out of range"),
    ("nodes", "sn,cpu_milli,memory_mib,gpu,model\nn0,1000,1,0,T4\n", "no node has a GPU"),
    ("pods", "name,cpu_milli\na,1\n", "row 1: missing column(s) memory_mib"),
    ("pods", "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec\na,1,1,1,500,V100\n",
     "row 2: gpu_spec: no node has GPU type 'V100'"),
    ("pods", "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec\na,1,-1,1,500,\n",
     "row 2: memory_mib: -1 is out of range"),
    ("pods", "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec\na,1,1,0,0,\n", "requests no GPU"),
    ("pods", b"name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec\na,1,1\x00,1,500,\n", "row 2: contains a NUL"),
    ("pods", "name,cpu_milli,memory_mib,num_gpu\na,1,1,1\n", "row 1: missing column(s) gpu_milli"),
    ("pods", "name,cpu_milli,memory_mib,num_gpu,gpu_milli\na,1,1,1,500\nb,1,1,99999999999999999999,1000\n",
     "row 3: num_gpu: 99999999999999999999 is out of range"),
    ("pods", "name,cpu_milli,memory_mib,num_gpu,gpu_milli\na,1,1,1,500\nb,1,1,1\n", "row 3: expected 5 columns"),
])
def test_bad_files_name_file_row_and_column(files: tuple[Path, Path], capsys: pytest.CaptureFixture[str],
                                            which: str, text: str | bytes, message: str) -> None:
    pods, nodes = files
    target = nodes if which == "nodes" else pods
    if isinstance(text, bytes):
        target.write_bytes(text)
    else:
        target.write_text(text)
    code, _, err = run(["simulate-placement", "--workload", str(pods), "--nodes", str(nodes)], capsys)
    assert code == 2, err
    assert message in err
    assert err.count("\n") == 1 and "Traceback" not in err


@pytest.mark.slow
def test_a_million_row_pod_list_is_refused_at_the_row_past_the_limit(files: tuple[Path, Path],
                                                                     capsys: pytest.CaptureFixture[str]) -> None:
    from broker.sim.sharing import MAX_POD_ROWS

    pods, nodes = files
    pods.write_text("name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec\n" + "p,1,1,1,100,\n" * 1_000_000)
    code, out, err = run(["simulate-placement", "--workload", str(pods), "--nodes", str(nodes)], capsys)
    assert code == 2, err
    assert err == f"error: {pods}: row {MAX_POD_ROWS + 2}: more than {MAX_POD_ROWS} rows\n"
    assert out == ""


def test_a_missing_file_is_one_line(files: tuple[Path, Path], tmp_path: Path,
                                    capsys: pytest.CaptureFixture[str]) -> None:
    pods, _ = files
    code, _, err = run(["simulate-placement", "--workload", str(pods), "--nodes", str(tmp_path / "nope.csv")],
                       capsys)
    assert code == 2 and "cannot read node list" in err


def test_the_cluster_mode_still_needs_a_cluster(files: tuple[Path, Path], capsys: pytest.CaptureFixture[str]) -> None:
    pods, _ = files
    code, _, err = run(["simulate-placement", "--workload", str(pods)], capsys)
    assert code == 2 and "--cluster" in err


def test_the_five_column_layout_of_the_multigpu_lists_replays(files: tuple[Path, Path],
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    pods, nodes = files
    pods.write_text("name,cpu_milli,memory_mib,num_gpu,gpu_milli\n"
                    "a,1000,1024,1,500\nb,1000,1024,2,1000\nc,500,512,0,0\nd,1000,1024,1,1000\n")
    code, out, err = run(["simulate-placement", "--workload", str(pods), "--nodes", str(nodes), "--json"], capsys)
    assert code == 0, err
    report = json.loads(out)["policies"]
    assert all(r["allocated_gpu_pct"] > 0 for r in report.values())


def _broker(home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    # The jobs must never start: provisioning takes a market day.
    env = {**os.environ, "BROKER_HOME": str(home), "BROKER_LOCAL_PROVISION_SECONDS": "86400"}
    for name in ("BROKER_SERVER", "BROKER_MARKET", "BROKER_BACKEND"):
        env.pop(name, None)
    return subprocess.run([sys.executable, "-m", "broker", *args], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=300)


@pytest.mark.slow
def test_the_sharing_examples_launch_as_docs_sharing_shows(tmp_path: Path) -> None:
    home = tmp_path / "home"
    job_ids = []
    try:
        for name in ("half-t4-two-nodes.yaml", "l4-l40-a10g.yaml"):
            launched = _broker(home, "launch", f"examples/sharing/{name}", "--backend", "local", "--detach")
            assert launched.returncode == 0, launched.stderr
            match = re.search(r"submitted (j-[0-9a-f]+)", launched.stdout)
            assert match, launched.stdout
            job_ids.append(match.group(1))
            if name == "l4-l40-a10g.yaml":
                [warning] = launched.stderr.splitlines()
                assert warning.startswith("warning: examples/sharing/l4-l40-a10g.yaml:6: resources.accelerators.L40: "
                                          "'L40' dropped from the accelerator choices: not sold on any of aws, gcp, "
                                          "azure")
                assert warning.endswith("the job keeps L4:1, A10G:1")
            else:
                assert launched.stderr == ""
    finally:
        for job_id in job_ids:
            _broker(home, "cancel", job_id)
