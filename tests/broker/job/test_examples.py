"""The PyTorch example end to end: ``broker launch`` on the embedded default meets the bundled market's
preemption, migrates, resumes from the checkpoint the helper wrote and ends with the same parameters as
an uninterrupted run.

Only PyTorch goes through the whole broker here: the bundled market's notice comes at a fixed market
time, and importing Lightning or Transformers can take longer than that on a loaded machine, which
would make the test depend on the machine's speed. Their callbacks are checked with the real libraries
in ``test_lightning.py`` and ``test_huggingface.py`` (a signal at a random step, a resume, the same
parameters), and they share the agent path this test covers."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from sqlalchemy import select

from broker.store import open_store
from broker.store.tables import CheckpointReportRow

ROOT = Path(__file__).resolve().parents[3]
MARKET_MINUTE_S = 60.0
# A third of the default speed: the bundled market reclaims the first zone 60 s (wall) after the start,
# which leaves a loaded machine time to import torch before the notice (at 60x it is 20 s).
SPEED = "20"


def _digest(text: str) -> str:
    [digest] = re.findall(r"parameters sha256 (\w+)", text)
    return digest


@pytest.mark.slow
@pytest.mark.timeout(600)
@pytest.mark.parametrize("framework", ["pytorch"])
def test_example_survives_a_preemption_and_ends_as_an_uninterrupted_run(broker_home: Path, tmp_path: Path,
                                                                         framework: str) -> None:
    pytest.importorskip({"pytorch": "torch", "lightning": "lightning", "huggingface": "transformers"}[framework])
    env = {**os.environ, "BROKER_HOME": str(broker_home), "BROKER_SPEED": SPEED}
    try:
        result = subprocess.run([sys.executable, "-m", "broker", "launch", f"examples/{framework}.yaml", "--json"],
                                cwd=ROOT, env=env, capture_output=True, text=True, timeout=420)
    finally:  # a launch cut short leaves its clusters up: take them down as the local cloud does
        for cluster in (broker_home / "local" / "clusters").glob("*/"):
            (cluster / "terminate").touch()
    assert result.returncode == 0, result.stderr[-3000:]
    summary = json.loads(result.stdout.strip().splitlines()[-1])
    assert summary["state"] == "SUCCEEDED"
    assert summary["preemptions"] >= 1 and summary["migrations"] >= 1
    assert summary["work_lost_seconds"] < 2 * MARKET_MINUTE_S

    logs = sorted((broker_home / "logs" / summary["job_id"]).glob("attempt-*-node-0.log"),
                  key=lambda p: int(p.name.split("-")[1]))
    texts = [log.read_text() for log in logs]
    saved = [[int(s) for s in re.findall(r"^checkpoint step-(\d+) ", text, re.MULTILINE)] for text in texts]
    assert saved[0], texts[0][-3000:]  # the first attempt checkpointed before its node was taken
    for before, text in zip(saved, texts[1:], strict=False):
        assert f"resuming from step-{max(before):08d}" in text  # from the newest, not from the start

    # The save times the helper measured reached the broker with the checkpoints (its Young/Daly input).
    store = open_store(f"sqlite:///{broker_home / 'broker.db'}")
    with store.transaction() as s:
        timed = list(s.scalars(select(CheckpointReportRow.save_seconds).where(
            CheckpointReportRow.job_id == summary["job_id"])))
    store.dispose()
    assert timed and all(x is not None and x >= 0 for x in timed)

    # The same script without the broker, no pacing, no interruption: the same final parameters.
    direct = subprocess.run([sys.executable, f"train_{framework}.py", "--steps", "400"], cwd=ROOT / "examples",
                            env={**os.environ, "BROKER_CHECKPOINT_DIR": str(tmp_path / "direct"),
                                 "BROKER_RESUME_FROM": ""},
                            capture_output=True, text=True, timeout=300)
    assert direct.returncode == 0, direct.stderr[-3000:]
    assert _digest(texts[-1]) == _digest(direct.stdout)
