"""The pool keeps an unheld cluster a while for the next job, then tears it down; a queue it cannot
serve does not wait for it."""

from __future__ import annotations

import time
from datetime import timedelta
from pathlib import Path

import pytest
from sqlalchemy import select

from broker.config.settings import load_settings
from broker.engine import Engine
from broker.runtime import assemble
from broker.spec.job import parse_job_spec
from broker.store.tables import AllocationRow, ClusterRow, JobRow
from tests.broker.engine.one_zone import one_zone_market, run_until

EXAMPLES = Path(__file__).resolve().parents[3] / "examples"
JOB = """\
name: {name}
num_nodes: {nodes}
resources:
  accelerators: V100:4
workdir: {workdir}
run: python train.py --steps 40 --step-seconds 0.05 --checkpoint-every 20
"""



def _clusters(engine: Engine) -> list[tuple[str, str, str | None]]:
    with engine.store.transaction() as s:
        rows = s.scalars(select(ClusterRow).order_by(ClusterRow.created_at))
        return [(r.id, r.state, r.teardown_reason) for r in rows]


def _state(engine: Engine, job_id: str) -> str:
    with engine.store.transaction() as s:
        return s.get(JobRow, job_id).state  # type: ignore[union-attr]


@pytest.mark.slow
def test_an_idle_cluster_waits_for_the_next_job_then_goes_and_a_queue_it_cannot_serve_frees_it(
        tmp_path: Path) -> None:
    path = tmp_path / "m.csv"
    one_zone_market(path, 4)
    settings = load_settings(market=path, speed=30.0, local_provision_seconds=60.0, max_gpus=8,
                             pool_idle_seconds=900.0)
    broker = assemble(settings, fresh_market=True)
    engine = broker.start()

    def submit(name: str, nodes: int = 1) -> str:
        return engine.submit(parse_job_spec(JOB.format(name=name, nodes=nodes, workdir=EXAMPLES),
                                            source=str(tmp_path / f"{name}.yaml")))
    try:
        a = submit("a")
        run_until(engine, lambda: _state(engine, a) == "SUCCEEDED")
        for _ in range(10):  # a few wall seconds, well under the 900 market s of pool idle time
            engine.step()
            time.sleep(0.1)
        assert [state for _, state, _ in _clusters(engine)] == ["UP"]  # kept for the next job
        b = submit("b")
        run_until(engine, lambda: _state(engine, b) == "SUCCEEDED")
        with engine.store.transaction() as s:
            assert {x.cluster_id for x in s.scalars(select(AllocationRow))} == {_clusters(engine)[0][0]}
        # A two-node job cannot use the one-node cluster; with it kept the pool (8 GPUs) would be full.
        c = submit("c", nodes=2)
        run_until(engine, lambda: _state(engine, c) == "SUCCEEDED")
        kept = _clusters(engine)
        assert kept[0][1] in ("TERMINATING", "TERMINATED") and kept[0][2] == "idle"
        # Nothing queued: c's cluster stays until the idle time has passed, then goes.
        ended = engine.clock.now()
        run_until(engine, lambda: engine.clock.now() > ended + timedelta(seconds=300))
        assert _clusters(engine)[1][1] == "UP"
        run_until(engine, lambda: _clusters(engine)[1][1] in ("TERMINATING", "TERMINATED"), timeout=120)
        assert _clusters(engine)[1][2] == "idle"
    finally:
        broker.close()


@pytest.mark.slow
def test_a_queue_grows_the_pool_only_within_its_own_gpu_limit(tmp_path: Path) -> None:
    path = tmp_path / "m.csv"
    one_zone_market(path, 4)
    settings = load_settings(market=path, speed=30.0, local_provision_seconds=60.0, max_gpus=16,
                             queue_max_gpus={"training": 4})
    broker = assemble(settings, fresh_market=True)
    engine = broker.start()
    text = JOB.replace("run: python train.py --steps 40", "run: python train.py --steps 200")

    def submit(name: str, priority: str | None = None, steps: int = 200) -> str:
        body = text.replace("--steps 200", f"--steps {steps}").format(name=name, nodes=1, workdir=EXAMPLES) + (
            f"broker:\n  priority: {priority}\n" if priority else "")
        return engine.submit(parse_job_spec(body, source=str(tmp_path / f"{name}.yaml")))
    try:
        a, b = submit("a"), submit("b")  # both training: one 4-GPU cluster between them
        # Another queue (one b cannot preempt): the pool has room. It outlasts a and b, so its GPUs,
        # free once it ends, are not what b takes (placing on a running cluster launches nothing).
        batch = submit("c", priority="inference", steps=1000)
        run_until(engine, lambda: _state(engine, a) == "RUNNING" and _state(engine, batch) == "RUNNING")
        assert _state(engine, b) == "PENDING"
        with engine.store.transaction() as s:
            from broker.store.tables import JobEventRow
            assert s.scalar(select(JobEventRow).where(JobEventRow.job_id == b, JobEventRow.kind == "queue_full"))
        run_until(engine, lambda: _state(engine, b) == "SUCCEEDED")
        with engine.store.transaction() as s:
            held = [(x.job_id, x.cluster_id, x.started_at, x.ended_at, x.outcome)
                    for x in s.scalars(select(AllocationRow).where(AllocationRow.job_id.in_([a, b])))]
        # The queue's 4 GPUs: no moment when a (any of its attempts) and b both held their 4.
        spans_a = [(start, end) for job, _, start, end, _ in held if job == a]
        spans_b = [(start, end) for job, _, start, end, _ in held if job == b]
        assert spans_a and spans_b and all(end is not None for _, _, _, end, _ in held), held
        assert all(end_b <= start_a or end_a <= start_b for start_a, end_a in spans_a
                   for start_b, end_b in spans_b), held
    finally:
        broker.close()
