"""One intake for the CLI, the API and the engine's tests: read the job file, judge it against the
market, store it PENDING (or nothing at all)."""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime
from pathlib import Path

import pytest
from sqlalchemy import func, select

from broker.clock import WallClock
from broker.intake import Intake, read_job, submit
from broker.market.book import PriceBook
from broker.spec.errors import SpecError
from broker.spec.job import JobSpec, Pipeline, load_job_spec, parse_job_file
from broker.store import Store, open_store
from broker.store.tables import JobRow
from providers.base import SpotQuote

JOB = "name: g\nnum_nodes: 2\nresources:\n  accelerators: MI355X:8\nrun: python train.py\n"
TASK = "name: {name}\nresources:\n  accelerators: {acc}\nrun: echo hi\n"


def _jobs(store: Store) -> int:
    with store.transaction() as s:
        return int(s.scalar(select(func.count()).select_from(JobRow)) or 0)


def test_an_instance_type_only_the_price_book_quotes_is_accepted(tmp_path: Path) -> None:
    job = tmp_path / "job.yaml"
    job.write_text(JOB)
    with pytest.raises(SpecError, match="MI355X"):  # the built-in catalog alone refuses it
        load_job_spec(job, offline=True)
    store = open_store(f"sqlite:///{tmp_path / 'broker.db'}")
    try:
        now = datetime.now(UTC)
        PriceBook(store).record("azure", [SpotQuote("azure", "eastus", "eastus-1", "Standard_ND96isr_MI355X_v6",
                                                    "MI355X", 8, 21.0, 42.0, now)], at=now)
        spec = read_job(JOB, str(job), Intake(tmp_path, "skypilot", offline=True), store)
        with pytest.raises(SpecError, match="MI355X"):  # the local backend has no price book to ask
            read_job(JOB, str(job), Intake(tmp_path, "local", offline=True), store)
    finally:
        store.dispose()
    assert isinstance(spec, JobSpec)
    assert (spec.num_nodes, spec.accelerator, spec.gpus_per_node) == (2, "MI355X", 8)


def test_a_pipeline_with_a_stage_the_market_cannot_hold_stores_nothing(tmp_path: Path) -> None:
    text = TASK.format(name="a", acc="V100:1") + "---\n" + TASK.format(name="b", acc="A100:8")
    pipeline = parse_job_file(text, source="p.yaml", offline=True)
    assert isinstance(pipeline, Pipeline)
    store = open_store(f"sqlite:///{tmp_path / 'broker.db'}")
    try:
        intake = Intake(tmp_path, "local", frozenset({("V100", 1)}))
        with pytest.raises(SpecError, match="no zone of the market offers A100:8"):
            submit(store, WallClock(), intake, pipeline)
        assert _jobs(store) == 0
        roomy = Intake(tmp_path, "local", frozenset({("V100", 1), ("A100", 8)}))
        renamed = submit(store, WallClock(), roomy, pipeline,
                         queued=lambda spec: dataclasses.replace(spec, name=spec.name + "-q"))
        with store.transaction() as s:
            assert [s.get(JobRow, job_id).name for job_id in renamed] == ["a-q", "b-q"]  # type: ignore[union-attr]
    finally:
        store.dispose()


def test_max_gpus_refuses_a_gang_bigger_than_the_broker_may_hold(tmp_path: Path) -> None:
    spec = parse_job_file(TASK.format(name="big", acc="V100:1").replace("resources:", "num_nodes: 4\nresources:"),
                          offline=True)
    assert isinstance(spec, JobSpec)
    store = open_store(f"sqlite:///{tmp_path / 'broker.db'}")
    try:
        with pytest.raises(SpecError, match="max_gpus: 2"):
            submit(store, WallClock(), Intake(tmp_path, "local", max_gpus=2), spec)
        assert _jobs(store) == 0
        (job_id,) = submit(store, WallClock(), Intake(tmp_path, "local", max_gpus=4), spec)
        assert job_id.startswith("j-")
    finally:
        store.dispose()
