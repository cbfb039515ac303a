"""``broker teams`` and the examples docs/fair-share.md shows, through the real entry point."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from broker.cli import main
from broker.config.settings import load_settings
from broker.config.teams import fair_share_config
from broker.spec.job import JobSpec, load_job_file
from policies.fair_share import FairShareRequest, QueuedGang, owed_shares

ROOT = Path(__file__).resolve().parents[3]
CONFIG = ROOT / "examples" / "fair-share" / "config.yaml"


def test_broker_teams_on_the_example_settings(capsys: pytest.CaptureFixture[str]) -> None:
    main(["teams", "--config", str(CONFIG), "--json"])
    said = json.loads(capsys.readouterr().out)
    assert said["capacity_gpus"] == 8
    lines = {line["team"]: line for line in said["teams"]}
    assert set(lines) == {"nlp", "vision", "research", "product"}
    assert lines["product"]["budget_left"] == 500.0 and lines["research"]["weight"] == 2.0
    main(["teams", "--config", str(CONFIG)])
    table = capsys.readouterr().out
    assert "product" in table and "$500.00" in table


def test_the_shares_the_page_states() -> None:
    fair = fair_share_config(load_settings(CONFIG))
    assert fair is not None and fair.budgets == (("product", 500.0),)
    busy = tuple(QueuedGang(f"{t}{i}", t, 1, 500, i) for t in ("nlp", "vision", "product") for i in range(8))
    owed = owed_shares(FairShareRequest(8, fair.teams, (), busy))
    assert owed == pytest.approx({"nlp": 8 / 3, "vision": 8 / 3, "product": 8 / 3})
    research_only = tuple(g for g in busy if g.team != "product")
    assert sum(owed_shares(FairShareRequest(8, fair.teams, (), research_only)).values()) == pytest.approx(8)
    nlp_only = tuple(g for g in busy if g.team == "nlp")
    assert owed_shares(FairShareRequest(8, fair.teams, (), nlp_only)) == pytest.approx({"nlp": 8})
    job = load_job_file(ROOT / "examples" / "fair-share" / "nlp-job.yaml", offline=True)
    assert isinstance(job, JobSpec) and job.broker.team == "nlp" and job.broker.work is not None


@pytest.mark.slow
def test_the_benchmark_command_prints_its_figures_and_baselines(shared_traces: Path) -> None:
    done = subprocess.run([sys.executable, "benchmarks/fair_share.py", "--traces", str(shared_traces), "--jobs", "400"],
                          cwd=ROOT,
                          capture_output=True, text=True, timeout=600, check=False)
    assert done.returncode == 0, done.stderr
    for policy in ("weighted_fair_share", "fifo", "static_quota"):
        assert f"\n{policy} " in done.stdout
    assert "utilisation vs FIFO:" in done.stdout and "reclaims under weighted_fair_share:" in done.stdout
