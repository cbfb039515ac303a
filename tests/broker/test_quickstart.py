"""The quickstart end to end: a real 2-node job through a real preemption and migration."""

from __future__ import annotations

import itertools
import json
import os
import re
import subprocess
import sys
from datetime import timedelta
from pathlib import Path

import pytest
from sqlalchemy import func, select

from broker.store import open_store
from broker.store.tables import ClusterRow, LedgerRow

ROOT = Path(__file__).resolve().parents[2]


def _steps(log: Path) -> tuple[int, list[int], list[int]]:
    """(resumed-from step or 0, steps run, checkpoint steps completed) from one attempt's node-0 log."""
    text = log.read_text()
    resumed = re.search(r"resumed from step-(\d+)\.npz", text)
    steps = [int(m) for m in re.findall(r"^step (\d+) ", text, re.MULTILINE)]
    checkpoints = [int(m) for m in re.findall(r"^checkpoint step-(\d+)\.npz", text, re.MULTILINE)]
    return (int(resumed.group(1)) if resumed else 0), steps, checkpoints


@pytest.mark.slow
def test_quickstart_survives_a_preemption(broker_home: Path) -> None:
    env = {**os.environ, "BROKER_HOME": str(broker_home)}
    result = subprocess.run([sys.executable, "-m", "broker", "launch", "examples/quickstart.yaml", "--json"],
                            cwd=ROOT, env=env, capture_output=True, text=True, timeout=240)
    assert result.returncode == 0, result.stderr[-3000:]
    summary = json.loads(result.stdout.strip().splitlines()[-1])
    assert summary["state"] == "SUCCEEDED"
    assert summary["preemptions"] >= 1 and summary["migrations"] >= 1
    assert len(set(summary["zones"])) >= 2, summary["zones"]

    # Every attempt resumed exactly from the last checkpoint the one before it completed and ran
    # on from there, so no step up to that checkpoint ran twice; the last attempt reached the target.
    logs = sorted((broker_home / "logs" / summary["job_id"]).glob("attempt-*-node-0.log"),
                  key=lambda p: int(p.name.split("-")[1]))
    assert len(logs) == summary["migrations"] + 1
    attempts = [_steps(log) for log in logs]
    for (_, _, checkpoints), (resumed, _, _) in itertools.pairwise(attempts):
        assert checkpoints and resumed == max(checkpoints)
    for resumed, steps, _ in attempts[1:]:
        assert resumed > 0 and min(steps) == resumed + 1
    lineage = [step for (resumed, steps, _), nxt in zip(attempts, [*attempts[1:], None], strict=True)
               for step in steps if nxt is None or step <= nxt[0]]
    assert lineage == list(range(1, 401))  # the steps that count: each exactly once, in order
    assert max(attempts[-1][1]) == 400
    assert "done: 400 steps" in logs[-1].read_text()

    # The agent signalled the job within a second of the notice's first appearance.
    noticed = [json.loads(p.read_text()) | {"dir": p.parent}
               for p in (broker_home / "local" / "clusters").glob("*/status.json")]
    [preempted] = [c for c in noticed if "notice_wall" in c]
    first_cluster, notice_wall = preempted["dir"], preempted["notice_wall"]
    events = [json.loads(line) for path in first_cluster.glob("runs/*/node-*/status.events")
              for line in path.read_text().splitlines()]
    signaled = [e["wall"] for e in events if e["event"] == "signaled"]
    assert len(signaled) >= 2  # every node's agent signalled its own job
    assert max(signaled) - notice_wall < 1.0

    # The ledger: totals equal the sum of its entries and what status reports; each cluster's minutes
    # are contiguous and counted once.
    store = open_store(f"sqlite:///{broker_home / 'broker.db'}")
    with store.transaction() as s:
        rows = list(s.scalars(select(LedgerRow).order_by(LedgerRow.cluster_id, LedgerRow.minute)))
        total = s.scalar(select(func.sum(LedgerRow.cost)))
        clusters = list(s.scalars(select(ClusterRow)))
    store.dispose()
    assert total == pytest.approx(sum(r.cost for r in rows))
    mine = [r for r in rows if r.job_id == summary["job_id"]]
    assert sum(r.cost for r in mine) == pytest.approx(summary["cost"], abs=1e-5)
    assert sum(r.on_demand_cost for r in mine) == pytest.approx(summary["on_demand_cost"], abs=1e-5)
    # The only GPU time not the job's: idle after it finished, in the minute its cluster went down.
    ended = {c.id: c.terminated_at for c in clusters}
    for row in rows:
        if row.job_id is None:
            assert row.usage == "finished", row.usage
            assert ended[row.cluster_id] - row.minute <= timedelta(minutes=1)
    assert {c.zone for c in clusters if c.up_at} == set(summary["zones"])
    for cluster in clusters:
        minutes = [(r.minute, r.job_id) for r in rows if r.cluster_id == cluster.id]
        assert len(minutes) == len(set(minutes))
        times = sorted(minute for minute, _ in minutes)
        assert all((b - a).total_seconds() <= 60 for a, b in itertools.pairwise(times))
        if minutes:
            covered = sum(r.cost for r in rows if r.cluster_id == cluster.id)
            assert cluster.terminated_at is not None
            hours = (cluster.terminated_at - cluster.created_at).total_seconds() / 3600
            assert covered == pytest.approx(hours * cluster.num_nodes * cluster.price_per_node_hour, rel=0.05)
