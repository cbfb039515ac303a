"""Every flag that takes a number refuses NaN, infinities and values out of range, and every path flag
that is not a file, in one line naming the flag and exit 2: nothing runs, nothing is written."""

from __future__ import annotations

from pathlib import Path

import pytest

from broker.cli import main

ROOT = Path(__file__).resolve().parents[3]
JOB = str(ROOT / "examples" / "quickstart.yaml")
MARKET = str(ROOT / "broker" / "data" / "quickstart-market.csv")
WORKLOAD = """job_id,num_gpus,submit_time,duration,model
a,1,0,100,resnet
"""


@pytest.fixture
def workload(tmp_path: Path) -> str:
    path = tmp_path / "w.csv"
    path.write_text(WORKLOAD)
    return str(path)


@pytest.mark.parametrize(("args", "flag"), [
    (["simulate", JOB, "--market", MARKET, "--checkpoint-gb", "nan"], "--checkpoint-gb"),
    (["simulate", JOB, "--market", MARKET, "--checkpoint-gb", "inf"], "--checkpoint-gb"),
    (["simulate", JOB, "--market", MARKET, "--checkpoint-gb", "1e308"], "--checkpoint-gb"),
    (["simulate", JOB, "--market", MARKET, "--egress-per-gb", "nan"], "--egress-per-gb"),
    (["simulate", JOB, "--market", MARKET, "--egress-per-gb", "-inf"], "--egress-per-gb"),
    (["simulate", JOB, "--market", MARKET, "--starts", "1000000"], "--starts"),
    (["simulate", JOB, "--market", MARKET, "--starts", "2", "--seed", "-1"], "--seed"),
    (["simulate", JOB, "--market", MARKET, "--timeline", "/tmp"], "--timeline"),
    (["simulate", JOB, "--market", MARKET, "--timeline", "/proc/version"], "--timeline"),
    (["prices", "--max-price", "nan"], "--max-price"),
    (["prices", "--max-price", "inf"], "--max-price"),
    (["prices", "--min-gpus", "9" * 30], "--min-gpus"),
    (["prices", "--since", "9" * 400 + "d", "--export-trace", "t.csv"], "--since"),
    (["report", "--team", "a" * 100_000], "--team"),
    (["report", "--team", "[/bold]"], "--team"),
    (["report", "--resend", "\u0661\u0662"], "--resend"),
    (["token", "create", "--team", "t", "--expires-in", "inf"], "--expires-in"),
    (["status", "--limit", "0"], "--limit"),
    (["status", "--limit", "-5"], "--limit"),
    (["status", "--limit", "9" * 30], "--limit"),
    (["status", "--state", "sleeping"], "--state"),
    (["status", "--state", "running\x00"], "--state"),
    (["status", "--state", "r" * 100_000], "--state"),
])
def test_a_number_or_path_out_of_range_is_one_line_and_exit_2(args: list[str], flag: str,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(args)
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert flag in err and "Traceback" not in err and len(err.strip().splitlines()) == 1, err


@pytest.mark.parametrize(("extra", "flag"), [(["--cluster", "10000000xp3.16xlarge"], "--cluster"),
                                             (["--cluster", "9" * 5000 + "xp3.16xlarge"], "--cluster"),
                                             (["--cluster", "8xp3.16xlarge", "--seed", "-1"], "--seed")])
def test_simulate_placement_bounds_its_cluster_and_seed(workload: str, extra: list[str], flag: str,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["simulate-placement", "--workload", workload, *extra])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert flag in err and "Traceback" not in err and len(err) < 400
