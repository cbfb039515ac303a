"""What every part of the engine is given: its options, its collaborators, and the calls it defers.

``Parts`` holds the store, clock, market, provisioner, policies and agent tokens one engine runs
with, and the parsed-spec cache (only a cache: specs are re-read from the store after a restart).
``AfterCommit`` collects the provisioner calls decided inside a transaction, made once it commits.
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from sqlalchemy.orm import Session

from broker.backends.base import ClusterInfo, JobLaunch, Provisioner
from broker.clock import Clock
from broker.config.teams import FairShareConfig, fair_share_config
from broker.market.book import Market
from broker.spec.job import JobSpec, job_spec_from_data
from broker.store import Store
from broker.store.db import Fenced
from broker.store.tables import JobEventRow, JobRow
from policies import kinds

if TYPE_CHECKING:
    from broker.config.settings import Settings

log = logging.getLogger("broker.engine")

# The restart overhead a plan assumes when the settings name none and the backend is a real cloud.
CLOUD_RESTART_OVERHEAD_S = 720.0


@dataclass(frozen=True)
class EngineOptions:
    home: Path
    selection_policy: str | None = None
    placement_policy: str | None = None
    preemption_policy: str | None = None
    broker_url: str | None = None
    restart_overhead_s: float = CLOUD_RESTART_OVERHEAD_S
    checkpoint_gb: float = 0.0  # size of a job's checkpoint, for the cost of moving it between regions
    egress_per_gb: float = 0.02  # USD per GB moved between regions or clouds
    max_gpus: int | None = None  # GPUs the broker may hold across all its clusters
    start_retries: int = 2  # a job whose start fails this many times more FAILS with the error
    # A gate a PENDING job must pass before it is planned (the service's capacity shares); None: all pass.
    admit: Callable[[Session, JobRow], bool] | None = None
    eager_policy: str | None = None  # eager allocation (policies/eager.py); None: the registry's default, off
    eager_lead_s: float = 120.0
    pool_idle_s: float = 0.0  # market seconds an unheld cluster is kept for the queue
    queue_max_gpus: tuple[tuple[str, int], ...] = ()  # (queue, GPUs its jobs' clusters may hold)
    gpu_idle_below: float = 0.10  # a measured GPU-minute below this mean utilisation is held idle
    gpu_sampler: str | None = None  # module:callable replacing the agents' NVML reader (BROKER_GPU_SAMPLER)
    # Pass over the queued jobs that certainly wait (broker.engine.queue); False: the full decision for
    # every queued job on every pass (the reference the benchmark and the parity test compare against).
    queue_fast_path: bool = True
    # Teams' shares of the fleet and enforced budgets (broker.engine.fair_share); None: no fair-share step.
    fair_share: FairShareConfig | None = None


def restart_overhead(settings: Settings) -> float:
    """Seconds a restart costs a job, as the settings give it or the backend implies."""
    if settings.restart_overhead_s is not None:  # 0 is a setting too
        return settings.restart_overhead_s
    return settings.local_provision_seconds + 60.0 if settings.backend == "local" else CLOUD_RESTART_OVERHEAD_S


def engine_options(settings: Settings, broker_url: str | None, **extra: Any) -> EngineOptions:
    """The engine's options as the settings give them; every runtime (embedded, service, SkyPilot) uses this."""
    return EngineOptions(
        home=settings.home, selection_policy=settings.selection_policy,
        placement_policy=settings.placement_policy, preemption_policy=settings.preemption_policy,
        max_gpus=settings.max_gpus, restart_overhead_s=restart_overhead(settings), broker_url=broker_url,
        eager_policy=settings.eager_policy, eager_lead_s=settings.eager_lead_seconds,
        pool_idle_s=settings.pool_idle_seconds, queue_max_gpus=tuple(sorted(settings.queue_max_gpus.items())),
        start_retries=settings.start_retries, gpu_idle_below=settings.gpu_idle_below,
        gpu_sampler=settings.gpu_sampler,
        fair_share=fair_share_config(settings), **extra,
    )


class Place(Protocol):
    """A cluster as the backend, the planner and the cadence read it: a ``ClusterRow``, or just its
    columns (``running.Held``: thousands of running jobs' clusters read each pass, not loaded as rows)."""

    @property
    def id(self) -> str: ...
    @property
    def cloud(self) -> str: ...
    @property
    def region(self) -> str: ...
    @property
    def zone(self) -> str: ...
    @property
    def instance_type(self) -> str: ...
    @property
    def num_nodes(self) -> int: ...
    @property
    def gpus_per_node(self) -> int: ...
    @property
    def spot(self) -> bool: ...
    @property
    def handle(self) -> dict[str, Any]: ...


def cluster_info(row: Place, token: str | None = None) -> ClusterInfo:
    return ClusterInfo(row.id, row.cloud, row.region, row.zone, row.instance_type, row.num_nodes,
                       row.gpus_per_node, row.spot, token, dict(row.handle or {}))


@dataclass
class AfterCommit:
    """Provisioner calls decided inside a transaction, made once it has committed."""

    launches: list[ClusterInfo] = field(default_factory=list)
    starts: list[tuple[ClusterInfo, JobLaunch]] = field(default_factory=list)
    terminations: list[ClusterInfo] = field(default_factory=list)
    signals: list[tuple[ClusterInfo, str, int, str]] = field(default_factory=list)
    stops: list[tuple[ClusterInfo, str, int]] = field(default_factory=list)
    prepares: list[tuple[ClusterInfo, JobLaunch]] = field(default_factory=list)  # early setups
    prepare_stops: list[tuple[ClusterInfo, str, int]] = field(default_factory=list)

    @property
    def changed_others(self) -> bool:
        """Whether a call was decided that may change what other jobs see (anything but asking a job to
        checkpoint, which changes only that job: the batched views of a pass stay good)."""
        return any((self.launches, self.starts, self.terminations, self.stops, self.prepares, self.prepare_stops))

    @property
    def called(self) -> bool:
        """Whether any call was decided."""
        return any((self.launches, self.starts, self.terminations, self.signals, self.stops, self.prepares,
                    self.prepare_stops))

    def carry_out(self, provisioner: Provisioner,
                  start_failed: Callable[[ClusterInfo, JobLaunch, Exception], None] | None = None) -> None:
        """Make the calls; a start that raises goes to ``start_failed`` when given (a lost lease never does)."""
        for info in self.terminations:
            provisioner.terminate(info)
        for info, job_id, attempt, signal in self.signals:
            provisioner.signal_job(info, job_id, attempt, signal)
        for info, job_id, attempt in self.stops:
            provisioner.stop_job(info, job_id, attempt)
        for info, job_id, attempt in self.prepare_stops:
            provisioner.stop_prepare(info, job_id, attempt)
        for info in self.launches:
            provisioner.launch(info)
        for info, launch in self.prepares:
            try:
                provisioner.prepare_job(info, launch)
            except Fenced:
                raise
            except Exception as exc:  # the start finds it never began, and runs the setup itself
                log.warning("early setup of %s on %s failed to begin: %s", launch.job_id, info.id, exc)
        for info, launch in self.starts:
            try:
                provisioner.start_job(info, launch)
            except Fenced:
                raise
            except Exception as exc:
                if start_failed is None:
                    raise
                log.warning("starting %s attempt %s on %s failed: %s", launch.job_id, launch.attempt, info.id, exc)
                start_failed(info, launch, exc)


class Parts:
    """One engine's collaborators, handed to each of its modules."""

    def __init__(self, store: Store, clock: Clock, market: Market, provisioner: Provisioner,
                 options: EngineOptions, tokens: Callable[[str], str]) -> None:
        self.store = store
        self.clock = clock
        self.market = market
        self.provisioner = provisioner
        self.options = options
        self.policies = kinds.choose(
            selection_name=options.selection_policy, placement_name=options.placement_policy,
            preemption_name=options.preemption_policy, eager_name=options.eager_policy)
        self.selection = self.policies.selection
        self.placement = self.policies.placement
        self.preemption = self.policies.preemption
        self.eager = self.policies.eager
        # cluster id -> the token its agents authenticate with; the store keeps only hashes.
        self.tokens = tokens
        self._specs: dict[str, JobSpec] = {}
        self._parsed: dict[tuple[str, str], JobSpec] = {}  # (source, spec as stored) -> its parse

    def remember(self, job_id: str, spec: JobSpec) -> None:
        self._specs[job_id] = spec

    def spec_of(self, job: JobRow) -> JobSpec:
        if job.id not in self._specs:
            # Validated at submission; re-reading it must not consult catalogs, the clock or SkyPilot again
            # (importing SkyPilot takes seconds: a detached engine or `broker serve` on the local backend never does).
            # Jobs stored from the same file with the same text (a sweep's copies) share one parse.
            source = job.spec_path or job.name
            key = (source, json.dumps(job.spec, sort_keys=True, default=str))
            if key not in self._parsed:
                self._parsed[key] = job_spec_from_data(job.spec, source=source, offline=True, skypilot=False)
            self._specs[job.id] = self._parsed[key]
        return self._specs[job.id]

    def event(self, s: Session, job_id: str | None, kind: str, **detail: object) -> None:
        """A notable moment in a job's life that is not a change of its state."""
        if job_id is not None:
            s.add(JobEventRow(job_id=job_id, at=self.clock.now(), kind=kind, detail=jsonable(detail)))


def jsonable(detail: dict[str, object]) -> dict[str, object]:
    """An event's detail as JSON holds it: a datetime as ISO 8601, an infinite or NaN float (a preemption's
    unbounded gain) as its name, since PostgreSQL's json type refuses the bare ``Infinity`` token."""
    return {k: (v.isoformat() if isinstance(v, datetime) else str(v) if isinstance(v, float) and not math.isfinite(v)
                else v) for k, v in detail.items() if v is not None}
