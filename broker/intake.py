"""One way in for a job, whoever brings it (``broker launch``, ``POST /v1/jobs`` and ``/v1/pipelines``,
the engine's tests): read the job file, judge it against the market, store it PENDING.

On the SkyPilot backend a job file is judged by SkyPilot and the price book's quotes first: any instance type or
accelerator a cloud quotes is accepted, whether or not a catalog knows it; the catalogs judge the
rest (a pipeline's stages among them), and word the refusal.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from broker.clock import Clock
from broker.engine.feasibility import NodeKind, never_held
from broker.engine.machine import Within, submit_job, submit_pipeline
from broker.spec.job import JobSpec, Pipeline, SpecError, market_offers, parse_job_file, parse_job_quoted
from broker.store import Store


@dataclass(frozen=True)
class Intake:
    """What taking a job in needs to know about the broker it is submitted to."""

    home: Path
    backend: str
    # (accelerator, GPUs per node, instance type) the market offers; None when any may be asked for.
    offered: frozenset[NodeKind] | None = None
    # Validate against the built-in catalog only (an air-gapped service: SkyPilot's cannot be fetched).
    offline: bool = False
    max_gpus: int | None = None  # GPUs the broker may hold: a gang bigger than this is refused
    # Enforced budgets that refuse at submission (budgets.over_budget: refuse): (team, USD), and their period.
    refused_over: tuple[tuple[str, float], ...] = ()
    budget_period: str = "month"


def read_job(text: str, source: str, intake: Intake, store: Store | None) -> JobSpec | Pipeline:
    """The job file's text as a task or a pipeline; a SpecError naming the field otherwise.
    ``store``: where the price book is (on the SkyPilot backend).

    SkyPilot itself (seconds to import) judges the file only on the SkyPilot backend, which hands it the
    task; the local backend judges it by SkyPilot's schema, the built-in catalog and its market."""
    if intake.backend != "skypilot":
        return parse_job_file(text, source=source, offline=intake.offline, skypilot=False)
    from broker.market.book import PriceBook

    assert store is not None, "the SkyPilot backend judges a job by the price book in the store"

    return parse_job_quoted(text, source, market_offers(PriceBook(store).latest()), offline=intake.offline)


def market_problem(spec: JobSpec, intake: Intake) -> SpecError | None:
    """Why no offer of the market can ever hold ``spec`` (or the broker's ``max_gpus``); None if one may."""
    return never_held(spec, intake.offered, intake.max_gpus)


def submit(store: Store, clock: Clock, intake: Intake, job: JobSpec | Pipeline,
           queued: Callable[[JobSpec], JobSpec] | None = None, within: Within | None = None) -> list[str]:
    """Store ``job`` PENDING once the market can hold every task of it; their job ids, in stage order.

    A pipeline's stages are stored in one transaction, and nothing is stored when one is refused:
    the SpecError of the first refused task is raised. ``queued`` gives each task as it is queued
    (the API sets the token's team and its queue's priority); ``within`` is stored with the jobs, in
    their transaction (the API's idempotency key).
    """
    tasks = job.stages if isinstance(job, Pipeline) else (job,)
    for task in tasks:
        if (problem := market_problem(task, intake)) is not None:
            raise problem
    if queued is not None:
        tasks = tuple(queued(task) for task in tasks)
    if intake.refused_over:
        from broker.engine.fair_share import refuse_over_budget

        refuse_over_budget(store, clock.now(), intake.refused_over, intake.budget_period, tasks)
    if isinstance(job, Pipeline):
        return submit_pipeline(store, clock, dataclasses.replace(job, stages=tasks), intake.home, intake.backend,
                               within)
    return [submit_job(store, clock, tasks[0], intake.home, intake.backend, within)]
