"""The multi-team trace reader: hostile files refused in one line naming the file, row and field."""

from __future__ import annotations

from pathlib import Path

import pytest

from broker.sim.team_trace import MAX_ROWS, TeamTraceError, read_team_trace

HEADER = "team,job_id,num_gpus,submit_time,duration,priority\n"


def test_a_good_trace(tmp_path: Path) -> None:
    path = tmp_path / "t.csv"
    path.write_text(HEADER + "nlp,2,4,60,3600,1000\nvision,1,1,0,1800,\n")
    jobs = read_team_trace(path)
    assert [(j.team, j.job_id, j.gpus, j.submit_s, j.duration_s, j.priority) for j in jobs] == [
        ("vision", "1", 1, 0.0, 1800.0, 500), ("nlp", "2", 4, 60.0, 3600.0, 1000)]


@pytest.mark.parametrize(("content", "words"), [
    (b"\xff\xfe\x00garbage", "not text"),
    (b"team,job_id\x00,num_gpus\n", "NUL"),
    (b"a,b,c\n1,2,3\n", "missing column(s) team, job_id, num_gpus, submit_time, duration"),
    (HEADER.encode(), "no jobs"),
    ((HEADER + "a,1,nan,0,60,\n").encode(), "row 2: num_gpus must be between 1 and 100000, got nan"),
    ((HEADER + "a,1,1,inf,60,\n").encode(), "row 2: submit_time must be between"),
    ((HEADER + "a,1,1,0,-5,\n").encode(), "row 2: duration must be between 1"),
    ((HEADER + "a,1,1e308,0,60,\n").encode(), "row 2: num_gpus must be between"),
    ((HEADER + "a,1,1.5,0,60,\n").encode(), "row 2: num_gpus must be a whole number"),
    ((HEADER + "a,1,one,0,60,\n").encode(), "row 2: num_gpus must be a number, got 'one'"),
    ((HEADER + "a,1,1,0,60,99999\n").encode(), "row 2: priority must be between 0 and 10000"),
    ((HEADER + ",1,1,0,60,\n").encode(), "row 2: team: team name"),
    ((HEADER + "a\x01b,1,1,0,60,\n").encode(), "row 2: team: team name"),
    (HEADER.encode() + b"\xed\xa0\x80,1,1,0,60,\n", "not text"),
    ((HEADER + "a,1,1,0,60,\na,1,1,0,60,\n").encode(), "row 3: job_id '1' appears twice"),
    ((HEADER + "a,,1,0,60,\n").encode(), "row 2: job_id must be 1 to 100 printable characters"),
    ((HEADER + "a," + "x" * 200_000 + ",1,0,60,\n").encode(), "not a CSV file"),
], ids=["binary", "nul", "columns", "empty", "nan", "inf", "negative", "huge", "fraction", "word", "priority",
        "no-team", "control-team", "surrogate", "duplicate", "no-id", "huge-field"])
def test_hostile_traces_are_refused_naming_the_field(tmp_path: Path, content: bytes, words: str) -> None:
    path = tmp_path / "t.csv"
    path.write_bytes(content)
    with pytest.raises(TeamTraceError) as error:
        read_team_trace(path)
    said = str(error.value)
    assert words in said and "\n" not in said and len(said) < 400


def test_too_many_rows(tmp_path: Path) -> None:
    path = tmp_path / "t.csv"
    path.write_text(HEADER + "".join(f"a,{i},1,0,60,\n" for i in range(MAX_ROWS + 1)))
    with pytest.raises(TeamTraceError, match=f"more than {MAX_ROWS} jobs"):
        read_team_trace(path)
