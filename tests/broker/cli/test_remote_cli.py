"""The CLI against a running `broker serve` prints what it prints embedded, and refuses what the API refuses."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from sqlalchemy import select

from broker.config.settings import load_settings
from broker.store import open_store
from broker.store.tables import AllocationRow, ClusterRow
from broker.tokens import create_api_token
from tests.broker.cli.running import run_cli as _run
from tests.broker.service.replicas import ROOT, Replica, start_replica, two_zone_trace

JOB = """\
name: remote
num_nodes: 1
resources:
  accelerators: V100:1
workdir: {workdir}
run: python train.py --steps 40 --step-seconds 0.05 --checkpoint-every 20
broker:
  team: {team}
"""




@pytest.fixture
def replica(tmp_path: Path, broker_home: Path) -> object:
    env = {"BROKER_HOME": str(broker_home), "BROKER_SPEED": "60", "BROKER_LOCAL_PROVISION_SECONDS": "60",
           "BROKER_MARKET": str(two_zone_trace(tmp_path / "market.csv", cheap_lost_from=1000)),
           "BROKER_LEADER_CHECK_SECONDS": "1"}
    started = start_replica("only", env, tmp_path)
    yield started
    started.stop()


@pytest.mark.slow
def test_remote_commands_print_what_embedded_ones_do(tmp_path: Path, replica: Replica,
                                                     monkeypatch: pytest.MonkeyPatch,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    store = open_store(load_settings().database_url)
    monkeypatch.setenv("BROKER_TOKEN", create_api_token(store, "research").token)
    other_team = create_api_token(store, "vision").token
    store.dispose()
    job_file = tmp_path / "job.yaml"
    job_file.write_text(JOB.format(workdir=ROOT / "examples", team="research"))
    server = ["--server", replica.url]

    code, out, err = _run(["launch", str(job_file), "--json", *server], capsys)
    assert code == 0, err
    summary = json.loads(out)
    job_id = summary["job_id"]
    assert summary["state"] == "SUCCEEDED" and summary["team"] == "research"

    for argv in (["status", job_id, "--json"], ["status", "--json"], ["status"], ["logs", job_id]):
        remote = _run([*argv, *server], capsys)
        embedded = _run(argv, capsys)
        assert remote == embedded and remote[0] == 0, argv
    assert json.loads(_run(["status", job_id, "--json", *server], capsys)[1]) == summary
    assert "done: 40 steps" in _run(["logs", job_id, *server], capsys)[1]

    code, out, _ = _run(["launch", str(job_file), "--detach", *server], capsys)
    detached = out.split()[1].rstrip(";")
    assert code == 0 and out.startswith(f"submitted {detached}; follow it with `broker logs {detached} --follow`")
    assert _run(["cancel", detached, *server], capsys) == (0, f"{detached}: CANCELLED\n", "")
    again = _run(["cancel", detached], capsys)  # it ended (cancelled): said so, and not a success
    assert again[0] == 1 and again[1] == ""
    assert f"{detached} had already ended (CANCELLED): nothing to cancel" in again[2]

    bad = tmp_path / "bad.yaml"
    bad.write_text("name: t\nresources:\n  accelerators: V100:1\n")
    remote_bad = _run(["launch", str(bad), *server], capsys)
    embedded_bad = _run(["launch", str(bad)], capsys)
    assert remote_bad[0] == embedded_bad[0] == 2
    assert remote_bad[2] == embedded_bad[2] and "run: required" in remote_bad[2]

    monkeypatch.setenv("BROKER_TOKEN", other_team)
    code, _, err = _run(["status", job_id, *server], capsys)
    assert code == 2 and "belongs to another team" in err
    monkeypatch.delenv("BROKER_TOKEN")
    code, _, err = _run(["status", *server], capsys)
    assert code == 2 and "BROKER_TOKEN" in err


STAGE = """\
name: {name}
resources:
  accelerators: V100:1
workdir: {workdir}
run: python train.py --steps 10 --step-seconds 0.05
"""


@pytest.mark.slow
def test_remote_pipelines_print_what_embedded_ones_do(tmp_path: Path, replica: Replica,
                                                      monkeypatch: pytest.MonkeyPatch,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    store = open_store(load_settings().database_url)
    monkeypatch.setenv("BROKER_TOKEN", create_api_token(store, "research").token)
    store.dispose()
    stages = [STAGE.format(name=name, workdir=ROOT / "examples") for name in ("prep", "train")]
    job_file = tmp_path / "etl.yaml"
    job_file.write_text("name: etl\n---\n" + "---\n".join(stages))
    server = ["--server", replica.url]

    code, out, err = _run(["launch", str(job_file), "--json", *server], capsys)
    assert code == 0, err
    report = json.loads(out)
    assert report["pipeline"] == "etl"
    prep, train = report["stages"]
    assert [(s["name"], s["stage"], s["state"], s["team"]) for s in (prep, train)] == [
        ("prep", 1, "SUCCEEDED", "research"), ("train", 2, "SUCCEEDED", "research")]
    assert prep["pipeline_id"] == train["pipeline_id"]
    assert train["submitted_at"] <= prep["finished_at"]  # submitted together, the second held back till then
    store = open_store(load_settings().database_url)
    with store.transaction() as s:  # the second stage took the GPUs the first left, on the first's cluster
        cluster = s.scalar(select(ClusterRow).join(AllocationRow, AllocationRow.cluster_id == ClusterRow.id)
                           .where(AllocationRow.job_id == train["job_id"]))
        assert cluster is not None and cluster.job_id == prep["job_id"]
        assert (train["cloud"], train["zone"]) == (cluster.cloud, cluster.zone)  # `where` names it, not "-"
    store.dispose()

    for argv in (["status", "--json"], ["status"], ["status", train["job_id"], "--json"]):
        remote = _run([*argv, *server], capsys)
        assert remote == _run(argv, capsys) and remote[0] == 0, argv
    listed = {s["job_id"]: (s["pipeline_id"], s["stage"]) for s in json.loads(_run(["status", "--json", *server],
                                                                                  capsys)[1])}
    assert listed == {prep["job_id"]: (prep["pipeline_id"], 1), train["job_id"]: (prep["pipeline_id"], 2)}

    code, out, _ = _run(["launch", str(job_file), "--detach", "--json", *server], capsys)
    detached = json.loads(out)
    assert code == 0 and (detached["pipeline"], detached["kind"], detached["state"]) == ("etl", "chain", "PENDING")
    assert len(detached["job_ids"]) == 2
    code, out, _ = _run(["launch", str(job_file), "--detach", *server], capsys)
    assert code == 0 and out.startswith("submitted chain etl: 2 stages, run one after another\n  stage 1  j-")
    for job_id in detached["job_ids"]:
        _run(["cancel", job_id, *server], capsys)

    bad = tmp_path / "bad.yaml"
    bad.write_text("name: etl\n---\n" + stages[0] + "---\n" + stages[1] + "broker:\n  priority: urgent\n")
    remote_bad = _run(["launch", str(bad), *server], capsys)
    embedded_bad = _run(["launch", str(bad)], capsys)
    assert remote_bad[0] == embedded_bad[0] == 2
    assert remote_bad[2] == embedded_bad[2] and "bad.yaml (stage 2):" in remote_bad[2]
