"""The progress line ``broker launch`` shows: the job's last line on node 0 of its latest attempt."""

from __future__ import annotations

from pathlib import Path

from broker.status.summary import last_log_line


def _write(home: Path, job_id: str, name: str, text: str) -> None:
    folder = home / "logs" / job_id
    folder.mkdir(parents=True, exist_ok=True)
    (folder / name).write_text(text)


def test_the_latest_attempt_by_number_on_node_0_without_the_agents_lines(tmp_path: Path) -> None:
    _write(tmp_path, "j-1", "attempt-2-node-0.log", "step 20\n")
    _write(tmp_path, "j-1", "attempt-10-node-0.log", "step 100\nstep 101\n[agent] checkpoint saved\n\n")
    _write(tmp_path, "j-1", "attempt-10-node-1.log", "node one's line\n")
    assert last_log_line(tmp_path, "j-1") == "step 101"


def test_nothing_when_the_job_has_no_output_yet(tmp_path: Path) -> None:
    assert last_log_line(tmp_path, "j-2") == ""
    _write(tmp_path, "j-2", "attempt-1-node-1.log", "only node one\n")
    assert last_log_line(tmp_path, "j-2") == ""
