"""Bad job files: a message naming the problem, exit 2, and nothing written to the store."""

from __future__ import annotations

from pathlib import Path

import pytest

from broker.cli import main

VALID = """\
name: t
num_nodes: 2
resources:
  accelerators: V100:1
run: python train.py
"""


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("name: t\nresources:\n  accelerators: V100:1\n", "run"),
        (VALID.replace("V100:1", "H100:-1"), "accelerators"),
        (VALID + "colour: blue\n", "colour"),
        (VALID + "broker:\n  priority: [training\n", "line"),
        (VALID + "broker:\n  deadline: 2020-01-01T00:00:00Z\n", "deadline"),
    ],
    ids=["missing-run", "negative-gpus", "unknown-key", "yaml-syntax", "deadline-in-past"],
)
def test_bad_job_file(tmp_path: Path, broker_home: Path, capsys: pytest.CaptureFixture[str],
                      text: str, expected: str) -> None:
    job = tmp_path / "job.yaml"
    job.write_text(text)
    with pytest.raises(SystemExit) as exit_info:
        main(["launch", str(job)])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert "error:" in err and expected in err and "job.yaml" in err
    assert not (broker_home / "broker.db").exists()
    assert not (broker_home / "logs").exists()


def test_job_no_market_zone_fits(tmp_path: Path, broker_home: Path, capsys: pytest.CaptureFixture[str]) -> None:
    job = tmp_path / "job.yaml"
    job.write_text(VALID.replace("V100:1", "V100:8"))
    # A market of the quickstart's three V100 x1 zones alone (the bundled one offers every catalog type).
    bundled = Path(__file__).resolve().parents[3] / "broker" / "data" / "quickstart-market.csv"
    market = tmp_path / "v100x1.csv"
    market.write_text("".join(line for line in bundled.read_text().splitlines(keepends=True)
                              if line.startswith("time,") or ",V100,1," in line))
    with pytest.raises(SystemExit) as exit_info:
        main(["launch", str(job), "--market", str(market)])
    assert exit_info.value.code == 2
    assert "no zone of the market offers V100:8" in capsys.readouterr().err


def test_missing_file_is_a_clear_error(broker_home: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["launch", "nowhere.yaml"])
    assert exit_info.value.code == 2
    assert "nowhere.yaml" in capsys.readouterr().err


def test_unknown_option_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["status", "--no-such-flag"])
    assert exit_info.value.code == 2
    assert "--no-such-flag" in capsys.readouterr().err


def test_unknown_job_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["status", "j-nothere"])
    assert exit_info.value.code == 2
    assert "no job 'j-nothere'" in capsys.readouterr().err
