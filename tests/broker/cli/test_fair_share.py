"""``broker simulate-fairshare`` through the real entry point: a replay, and bad input in one line, exit 2."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.broker.cli.running import run_cli as _run

TRACE = "team,job_id,num_gpus,submit_time,duration\na,1,2,0,3600\na,2,2,0,3600\nb,3,1,600,1800\n"




def test_a_replay_compares_the_policies(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    trace = tmp_path / "t.csv"
    trace.write_text(TRACE)
    code, out, err = _run(["simulate-fairshare", "--gpus", "4", "--trace", str(trace), "--json"], capsys)
    assert code == 0, err
    said = {p["policy"]: p for p in json.loads(out)["policies"]}
    assert set(said) == {"weighted_fair_share", "fifo", "static_quota"}
    # b's job takes its GPU back from a at a checkpoint under fair share; FIFO makes it wait for a's end.
    assert said["weighted_fair_share"]["reclaims"] == 1 and said["fifo"]["reclaims"] == 0
    assert said["weighted_fair_share"]["teams"]["b"]["mean_wait_h"] < said["fifo"]["teams"]["b"]["mean_wait_h"]
    code, out, _ = _run(["simulate-fairshare", "--gpus", "4", "--trace", str(trace)], capsys)
    assert code == 0 and "weighted_fair_share" in out and "received / owed per team" in out


@pytest.mark.parametrize(("argv", "words"), [
    (["--gpus", "0", "--trace", "t.csv"], "--gpus"),
    (["--gpus", "nan", "--trace", "t.csv"], "--gpus"),
    (["--gpus", "4"], "give one of --trace FILE or --philly DIR"),
    (["--gpus", "4", "--trace", "t.csv", "--philly", "."], "give one of"),
    (["--gpus", "4", "--trace", "missing.csv"], "cannot read team trace missing.csv"),
    (["--gpus", "4", "--philly", "nowhere"], "--philly: cannot read workload"),
    (["--gpus", "4", "--trace", "bad.csv"], "bad.csv: row 2: num_gpus must be between"),
])
def test_bad_input_is_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
                               argv: list[str], words: str) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "t.csv").write_text(TRACE)
    (tmp_path / "bad.csv").write_text("team,job_id,num_gpus,submit_time,duration\na,1,-1,0,60\n")
    code, out, err = _run(["simulate-fairshare", *argv], capsys)
    assert code == 2
    lines = [line for line in err.splitlines() if line.strip()]
    assert "Traceback" not in err + out
    assert any(words in line for line in lines), err


def test_the_example_docs_fair_share_shows(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.chdir(Path(__file__).resolve().parents[3])
    code, out, err = _run(["simulate-fairshare", "--gpus", "4", "--trace", "examples/fair-share/two-teams.csv"], capsys)
    assert code == 0, err
    assert "6 jobs of 2 teams on 4 GPUs" in out
    cells = [[c.strip() for c in line.split("│")[1:-1]] for line in out.splitlines() if line.startswith("│")]
    rows = {row[0]: row[1:] for row in cells if row and row[0] in ("weighted_fair_share", "fifo")}
    assert rows["weighted_fair_share"][:3] == ["94.1%", "100.0%", "0.01"]
    assert rows["fifo"][:3] == ["94.4%", "99.8%", "1.28"]
