"""The report's section per team under fair share, from the ledger and the jobs' events, on SQLite and PostgreSQL."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from broker.cli import main
from broker.config.teams import FairShareConfig
from broker.reports.shares import team_shares
from broker.reports.window import Window
from broker.store import open_store
from broker.store.tables import ClusterRow, JobEventRow, JobRow, LedgerRow
from policies.fair_share import Team


def _seed(db_url: str, now: datetime) -> None:
    store = open_store(db_url)
    start = now - timedelta(hours=2)
    with store.transaction() as s:
        for job_id, team in (("ja", "a"), ("jb", "b"), ("jb2", "b")):
            s.add(JobRow(id=job_id, name=job_id, team=team, state="SUCCEEDED", priority=500, spec={}, backend="local",
                         num_nodes=1, gpus_per_node=1, checkpoint_dir="/c", created_at=start, updated_at=start,
                         zones=[], work_lost_s=90.0 if job_id == "ja" else 0.0))
        s.flush()
        s.add(ClusterRow(id="c1", launch_key="c1", job_id="ja", backend="local", cloud="aws", region="r", zone="z",
                         instance_type="p3.8xlarge", accelerator="V100", gpus_per_node=4, num_nodes=1, spot=True,
                         price_per_node_hour=4.0, on_demand_price_per_node_hour=12.0, state="TERMINATED",
                         token_hash="x", handle={}, created_at=start))
        s.flush()
        for minute in range(60):  # a runs 3 GPUs an hour; b 1 GPU, 1 USD a minute, two jobs in minute 30
            at = start + timedelta(minutes=minute)
            rows = [("ja", "a", 3.0, 0.1)] + ([("jb", "b", 0.5, 0.5), ("jb2", "b", 0.5, 0.5)] if minute == 30
                                               else [("jb", "b", 1.0, 1.0)])
            for job_id, team, gpus, cost in rows:
                s.add(LedgerRow(cluster_id="c1", minute=at, holder=f"job:{job_id}", job_id=job_id, team=team,
                                usage="running", cloud="aws", region="r", zone="z", instance_type="p3.8xlarge",
                                accelerator="V100", nodes=1, gpus=gpus, seconds=60.0, spot=True,
                                price_per_node_hour=4.0, on_demand_price_per_node_hour=12.0, cost=cost,
                                on_demand_cost=cost * 3))
        s.add(JobEventRow(job_id="ja", at=start + timedelta(minutes=20), kind="transition", from_state="RUNNING",
                          to_state="CHECKPOINTING", detail={"reason": "reclaimed by team b for jb"}))
        s.add(JobEventRow(job_id="jb", at=start + timedelta(minutes=20), kind="transition", from_state="PENDING",
                          to_state="PROVISIONING", detail={"reclaiming": ["ja"]}))
    store.dispose()


def test_share_received_against_owed_reclaims_and_the_last_of_a_budget(db_url: str) -> None:
    now = datetime.now(UTC).replace(second=0, microsecond=0)
    _seed(db_url, now)
    store = open_store(db_url)
    config = FairShareConfig(teams=(Team("a", weight=3), Team("b")))
    lines = {line.team: line for line in team_shares(store, Window(now - timedelta(days=1), now), config,
                                                      budgets=(("b", 30.5),), period="month")}
    store.dispose()
    a, b = lines["a"], lines["b"]
    assert (a.gpu_hours, b.gpu_hours) == (pytest.approx(3.0), pytest.approx(1.0))
    assert (a.share_received, b.share_received) == (0.75, 0.25)
    assert (a.share_owed, b.share_owed) == (0.75, 0.25)
    assert (a.reclaims_given, a.reclaims_taken, b.reclaims_given, b.reclaims_taken) == (1, 0, 0, 1)
    assert a.work_lost_hours == pytest.approx(90 / 3600, abs=1e-3)
    # b's 30.5 USD was reached in minute 30 (30 + 1.0), where both of its jobs ran.
    assert b.budget_spent_by == ["jb", "jb2"] and a.budget_spent_by == []


def test_broker_report_prints_the_section_with_teams_named(db_url: str, broker_home: Path,
                                                           monkeypatch: pytest.MonkeyPatch,
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    now = datetime.now(UTC).replace(second=0, microsecond=0)
    _seed(db_url, now)
    monkeypatch.setenv("BROKER_DB_URL", db_url)
    monkeypatch.setenv("BROKER_TEAMS", '{"a": {"weight": 1}, "b": {"weight": 1}}')
    main(["report", "--since", "1d", "--json"])
    said = json.loads(capsys.readouterr().out)
    shares = {line["team"]: line for line in said["fair_share"]}
    assert shares["a"]["share_owed"] == 0.5 and shares["a"]["share_received"] == 0.75
    main(["report", "--since", "1d"])
    assert "Fair share by team" in capsys.readouterr().out
    monkeypatch.delenv("BROKER_TEAMS")
    main(["report", "--since", "1d", "--json"])
    assert "fair_share" not in json.loads(capsys.readouterr().out)
