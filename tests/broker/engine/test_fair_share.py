"""The fair-share step: end to end on the embedded backend (two teams, reclaim at a checkpoint), and the
request it builds from the store (held, decayed usage, budgets at prices paid) on SQLite and PostgreSQL."""

from __future__ import annotations

import json
import math
import time
from collections import defaultdict
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from sqlalchemy import select

from broker.cli import main
from broker.config.settings import load_settings
from broker.config.teams import FairShareConfig
from broker.engine import Engine
from broker.engine.fair_share import FairShare, spent_by_team
from broker.engine.parts import EngineOptions, Parts
from broker.runtime import assemble
from broker.spec.job import parse_job_spec
from broker.store import open_store
from broker.store.tables import AllocationRow, ClusterRow, JobEventRow, JobRow, LedgerRow, ProgressRow
from policies.fair_share import Team
from tests.broker.engine.one_zone import one_zone_market, run_until

EXAMPLES = Path(__file__).resolve().parents[3] / "examples"

JOB = """\
name: {name}
resources:
  accelerators: V100:1
workdir: {workdir}
run: python train.py --steps {steps} --step-seconds 0.05 --checkpoint-every 1000
broker:
  team: {team}
  priority: batch
"""


def _submit(engine: Engine, tmp_path: Path, name: str, team: str, steps: int) -> str:
    text = JOB.format(name=name, team=team, workdir=EXAMPLES, steps=steps)
    return engine.submit(parse_job_spec(text, source=str(tmp_path / f"{name}.yaml")))


def _rows(engine: Engine, *job_ids: str) -> list[JobRow]:
    with engine.store.transaction() as s:
        rows = [s.get(JobRow, j) for j in job_ids]
        for row in rows:
            s.expunge(row)
        return rows  # type: ignore[return-value]


def _reported_progress(engine: Engine, job_ids: list[str]) -> bool:
    with engine.store.transaction() as s:
        return len(set(s.scalars(select(ProgressRow.job_id).where(ProgressRow.job_id.in_(job_ids))))) == len(job_ids)


@pytest.mark.slow
def test_a_team_gets_its_share_back_at_a_checkpoint_and_nothing_is_billed_twice(
        tmp_path: Path, broker_home: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("BROKER_TEAMS", '{"a": {"weight": 1}, "b": {"weight": 1}}')
    monkeypatch.setenv("BROKER_MAX_GPUS", "4")
    settings = load_settings(market=one_zone_market(tmp_path / "m.csv", 1), speed=30.0, local_provision_seconds=60.0)
    broker = assemble(settings, fresh_market=True)
    engine = broker.start()
    try:
        team_a = [_submit(engine, tmp_path, f"a{i}", "a", 400) for i in range(4)]
        run_until(engine, lambda: all(r.state == "RUNNING" for r in _rows(engine, *team_a)), timeout=600)
        # Each has reported progress, so its training loop (and its checkpoint signal handler) is up: a job
        # asked before that is stopped without a checkpoint, which a loaded machine made happen here.
        run_until(engine, lambda: _reported_progress(engine, team_a), timeout=600)
        team_b = [_submit(engine, tmp_path, f"b{i}", "b", 40) for i in range(2)]

        before = [(r.state, r.reason) for r in _rows(engine, *team_a)]
        # The fair-share step asks two of a's gangs to checkpoint for b's, at the first step that sees them (the
        # deadline only covers a machine too loaded to finish that step). Keyed on the events, which stay: a
        # victim that checkpoints within the same step is already PENDING and no longer marked taken.
        def asked() -> list[JobEventRow]:
            with engine.store.transaction() as s:
                events = list(s.scalars(select(JobEventRow).where(JobEventRow.job_id.in_(team_a),
                                                                  JobEventRow.to_state == "CHECKPOINTING")))
                for event in events:
                    s.expunge(event)
                return events

        run_until(engine, lambda: len(asked()) >= 2, timeout=120)
        a_rows, b_rows = _rows(engine, *team_a), _rows(engine, *team_b)
        events = asked()
        victims = [e.job_id for e in events]
        assert len(set(victims)) == 2, (before, [(r.state, r.reason) for r in (*a_rows, *b_rows)])
        named = sorted(b for e in events for b in team_b if f"for {b}" in str(e.detail))  # one of b's each
        assert named == sorted(team_b), [(e.job_id, e.detail) for e in events]
        assert all("reclaimed by team b" in str(e.detail) for e in events), [(e.job_id, e.detail) for e in events]
        assert all(r.state in ("CHECKPOINTING", "PENDING") for r in a_rows if r.id in victims)
        assert all(r.state == "RUNNING" and r.reason is None for r in a_rows if r.id not in victims)
        assert all((r.reason or "").startswith("reclaiming 1 GPU from team a") or r.state == "RUNNING"
                   for r in b_rows)

        # Once they have checkpointed, they leave: PENDING with the reason, and b's gangs are started on their
        # GPUs within two engine steps (then RUNNING once their processes are up, which takes what it takes).
        run_until(engine, lambda: all(r.state == "PENDING" for r in _rows(engine, *victims)), timeout=600)

        def b_started() -> bool:
            with engine.store.transaction() as s:
                return len(set(s.scalars(select(AllocationRow.job_id).where(AllocationRow.job_id.in_(team_b))))) == 2

        steps = 0
        while not b_started():
            engine.step()
            steps += 1
            assert steps <= 2, [(r.state, r.reason) for r in _rows(engine, *team_b)]
        run_until(engine, lambda: all(r.state == "RUNNING" for r in _rows(engine, *team_b)), timeout=600)
        engine.step()
        assert [r.reason for r in _rows(engine, *victims)] == ["waiting: team a over its share (holds 2 of 2 GPUs "
                                                               "owed)"] * 2
        run_until(engine, lambda: all(r.state in ("SUCCEEDED", "FAILED") for r in _rows(engine, *team_a, *team_b)),
                  timeout=900)
        for _ in range(3):
            engine.step()
            time.sleep(0.1)
        with engine.store.transaction() as s:
            jobs = {j.id: j for j in s.scalars(select(JobRow))}
            clusters = list(s.scalars(select(ClusterRow)))
            ledger = list(s.scalars(select(LedgerRow)))
            events = list(s.scalars(select(JobEventRow).where(JobEventRow.job_id.in_(team_b))))
            for job in jobs.values():
                s.expunge(job)
    finally:
        broker.close()

    assert {j.state for j in jobs.values()} == {"SUCCEEDED"}
    assert len(clusters) == 1
    # What `broker teams` says afterwards: a gave two gangs' GPUs back, b took them.
    main(["teams", "--json"])
    said = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    lines = {line["team"]: line for line in said["teams"]}
    assert (lines["a"]["reclaims_given"], lines["b"]["reclaims_taken"], lines["a"]["held_gpus"]) == (2, 2, 0)
    assert said["capacity_gpus"] == 4
    assert any(e.to_state == "PROVISIONING" and sorted(e.detail.get("reclaiming", [])) for e in events)
    for victim in victims:
        assert jobs[victim].preemptions == 1 and jobs[victim].attempt == 2
        log = (broker_home / "logs" / victim / "attempt-2-node-0.log").read_text()
        assert "resumed from step-" in log and "done: 400 steps" in log
    assert all(j.reason is None for j in jobs.values())  # no stale "waiting" once they ran
    # Every minute of the cluster accounts for its 4 GPUs exactly once across holders: nothing billed twice.
    per_minute: dict[datetime, float] = defaultdict(float)
    for row in ledger:
        per_minute[row.minute] += row.gpus
    assert per_minute and all(total == pytest.approx(4.0) for total in per_minute.values())
    assert {r.team for r in ledger if r.job_id} == {"a", "b"}


class _Fixed:
    """A clock stopped at one moment."""

    speed = 1.0

    def __init__(self, now: datetime) -> None:
        self._now = now

    def now(self) -> datetime:
        return self._now

    def to_clock(self, wall_epoch: float) -> datetime:
        return self._now


def _job(s: object, job_id: str, team: str, state: str, gpus: int, created: datetime, work_s: float | None = None,
         preempted_by: str | None = None, accelerator: str | None = None) -> None:
    s.add(JobRow(id=job_id, name=job_id, team=team, state=state, priority=500, spec={}, backend="local",  # type: ignore[attr-defined]
                 num_nodes=1, gpus_per_node=gpus, checkpoint_dir="/c", created_at=created, updated_at=created,
                 zones=[], work_s=work_s, preempted_by=preempted_by, accelerator=accelerator))


def test_the_request_from_the_store(db_url: str, tmp_path: Path) -> None:
    now = datetime(2026, 3, 10, 12, tzinfo=UTC)
    store = open_store(db_url)
    with store.transaction() as s:
        _job(s, "a-run", "a", "RUNNING", 2, now - timedelta(hours=3), work_s=3 * 3600.0, accelerator="V100")
        _job(s, "a-leaving", "a", "CHECKPOINTING", 1, now - timedelta(hours=3), preempted_by="b-wait")
        _job(s, "b-old", "b", "SUCCEEDED", 4, now - timedelta(hours=5))
        _job(s, "b-wait", "b", "PENDING", 1, now - timedelta(minutes=5), work_s=7200.0, accelerator="A100")
        _job(s, "cpu", "c", "PENDING", 0, now)
        s.flush()
        s.add(ClusterRow(id="c1", launch_key="c1", job_id="a-run", backend="local", cloud="aws", region="r",
                         zone="z", instance_type="p3.8xlarge", accelerator="V100", gpus_per_node=4, num_nodes=1,
                         spot=True, price_per_node_hour=4.0, on_demand_price_per_node_hour=12.0, state="UP",
                         token_hash="x", handle={}, created_at=now - timedelta(hours=5)))
        s.flush()
        # a has run 2 GPUs for the last hour; b ran 4 GPUs from 5 h to 4 h ago.
        s.add(AllocationRow(job_id="a-run", cluster_id="c1", attempt=1, gpus={"0": [0, 1]},
                            started_at=now - timedelta(hours=1), running_at=now - timedelta(hours=1)))
        s.add(AllocationRow(job_id="b-old", cluster_id="c1", attempt=1, gpus={"0": [0, 1, 2, 3]},
                            started_at=now - timedelta(hours=5), running_at=now - timedelta(hours=5),
                            ended_at=now - timedelta(hours=4)))
        for minute, team, job, cost in ((now - timedelta(days=2), "b", "b-old", 30.0),
                                        (now - timedelta(days=20), "b", "b-old", 500.0),  # last month
                                        (now - timedelta(hours=1), "a", "a-run", 2.0)):
            s.add(LedgerRow(cluster_id="c1", minute=minute, holder=f"job:{job}", job_id=job, team=team,
                            usage="running", cloud="aws", region="r", zone="z", instance_type="p3.8xlarge",
                            accelerator="V100", nodes=1, gpus=2.0, seconds=3600.0, spot=True, price_per_node_hour=4.0,
                            on_demand_price_per_node_hour=12.0, cost=cost, on_demand_cost=cost * 3))
    config = FairShareConfig(teams=(Team("a"), Team("b")), half_life_s=3600.0, capacity_gpus=4,
                             budgets=(("b", 40.0),))
    parts = Parts(store, _Fixed(now), market=None, provisioner=None, options=EngineOptions(home=tmp_path),  # type: ignore[arg-type]
                  tokens=lambda c: "")
    fair = FairShare(parts, config)
    with store.transaction() as s:
        jobs = list(s.scalars(select(JobRow).where(JobRow.state.in_(["RUNNING", "CHECKPOINTING", "PENDING"]))))
        request = fair.request(s, jobs, now)
        spent = spent_by_team(s, datetime(2026, 3, 1, tzinfo=UTC))
    store.dispose()

    usage = {u.team: u for u in request.usage}
    assert usage["a"].held_gpus == 2  # the gang already giving its GPU back is not counted
    assert usage["b"].held_gpus == 0
    # 2 GPUs for the last hour: 2 * h/ln2 * (1 - 1/2); b's hour ended 4 h ago: 4 * h/ln2 * (2^-4 - 2^-5).
    h = 3600.0
    assert usage["a"].decayed_gpu_s == pytest.approx(2 * h / math.log(2) * 0.5, rel=1e-6)
    assert usage["b"].decayed_gpu_s == pytest.approx(4 * h / math.log(2) * (2 ** -4 - 2 ** -5), rel=1e-6)
    assert spent == pytest.approx({"a": 2.0, "b": 30.0})  # this month's ledger only
    assert usage["b"].budget_left == pytest.approx(10.0) and usage["a"].budget_left is None
    (gang,) = request.queued  # the CPU job is not gated
    # Paid this month: 32 USD for 4 GPU-hours: 8 USD per GPU-hour; b-wait is 2 h of 1 GPU.
    assert (gang.job_id, gang.gpus, gang.predicted_cost) == ("b-wait", 1, pytest.approx(16.0))
    # Per GPU type, for quotas per type; run times and predicted ends, for the reservation: a-run's 3 h of
    # work, running for the last hour, gives its 2 GPUs back in 2 h.
    assert (gang.gpu_type, gang.runtime_s) == ("A100", 7200.0)
    assert usage["a"].held_by_type == (("V100", 2),) and usage["b"].held_by_type == ()
    assert request.releases == ((pytest.approx(7200.0), 2),)
    decision = fair.policy(request)
    assert decision.reason_of("b-wait") == "waiting: budget: team b has $10.00 left this period, " \
                                           "the job is predicted to cost $16.00"


def _spend(store_url: str, team: str, cost: float, at: datetime) -> None:
    store = open_store(store_url)
    with store.transaction() as s:
        if s.get(ClusterRow, "c-old") is None:
            s.add(ClusterRow(id="c-old", launch_key="c-old", job_id=None, backend="local", cloud="aws", region="r",
                             zone="z", instance_type="p3.2xlarge", accelerator="V100", gpus_per_node=1, num_nodes=1,
                             spot=True, price_per_node_hour=1.0, on_demand_price_per_node_hour=3.0, state="TERMINATED",
                             token_hash="x", handle={}, created_at=at))
            s.flush()
        s.add(LedgerRow(cluster_id="c-old", minute=at, holder=f"job:j-{team}", job_id=f"j-{team}", team=team,
                        usage="running", cloud="aws", region="r", zone="z", instance_type="p3.2xlarge",
                        accelerator="V100", nodes=1, gpus=1.0, seconds=cost * 3600, spot=True, price_per_node_hour=1.0,
                        on_demand_price_per_node_hour=3.0, cost=cost, on_demand_cost=cost * 3))
    store.dispose()


@pytest.mark.parametrize(("spent", "work", "refused"), [
    (9.0, None, False), (10.0, None, True), (12.0, None, True), (6.0, "4h", False), (6.0, "5h", True),
], ids=["under", "exactly-spent", "overspent", "work-just-fits", "work-past-it"])
def test_an_enforced_budget_refuses_at_submission(db_url: str, tmp_path: Path, broker_home: Path,
                                                  spent: float, work: str | None, refused: bool) -> None:
    from broker.engine.fair_share import OverBudget

    settings = load_settings(db_url=db_url, market=one_zone_market(tmp_path / "m.csv", 1),
                             budgets={"teams": {"nlp": 10.0}, "enforce": True, "over_budget": "refuse"})
    broker = assemble(settings, fresh_market=True)
    try:
        _spend(db_url, "nlp", spent, broker.clock.now() - timedelta(minutes=5))  # 1 USD per GPU-hour paid
        text = JOB.format(name="j", team="nlp", workdir=EXAMPLES, steps=10) + (f"  work: {work}\n" if work else "")
        spec = parse_job_spec(text, source=str(tmp_path / "j.yaml"))
        other = parse_job_spec(JOB.format(name="k", team="vision", workdir=EXAMPLES, steps=10),
                               source=str(tmp_path / "k.yaml"))
        broker.submit(other)  # a team without a budget is never refused
        if refused:
            with pytest.raises(OverBudget, match=r"^budget: team nlp has \$[0-9.]+ left of its \$10.00 monthly "
                                                 r"budget, and the job is predicted to cost \$[0-9.]+; refused$"):
                broker.submit(spec)
        else:
            broker.submit(spec)
        with broker.store.transaction() as s:
            teams = sorted(j.team for j in s.scalars(select(JobRow)))
    finally:
        broker.close()
    assert teams == (["vision"] if refused else ["nlp", "vision"])


def test_a_team_over_its_enforced_budget_waits_while_another_starts(tmp_path: Path, broker_home: Path,
                                                                    db_url: str) -> None:
    settings = load_settings(db_url=db_url, market=one_zone_market(tmp_path / "m.csv", 1), speed=30.0,
                             local_provision_seconds=60.0, max_gpus=4,
                             budgets={"teams": {"a": 10.0}, "enforce": True, "over_budget": "wait"})
    broker = assemble(settings, fresh_market=True)
    engine = broker.start()
    try:
        _spend(db_url, "a", 10.0, engine.clock.now() - timedelta(minutes=5))  # spent to the cent
        over = _submit(engine, tmp_path, "a0", "a", 10)
        other = _submit(engine, tmp_path, "b0", "b", 10)
        for _ in range(3):
            engine.step()
        held, started = _rows(engine, over, other)
    finally:
        broker.close()
    assert held.state == "PENDING"
    assert held.reason == "waiting: budget: team a has $0.00 left this period, the job is predicted to cost $0.00"
    assert started.state in ("PROVISIONING", "RUNNING")
