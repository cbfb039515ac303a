"""What a job file says, validated and immutable: ``JobSpec`` (one task) and ``Pipeline`` (a chain or
group of tasks), and ``MarketOffer`` (what a market sells, to judge a job against)."""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from broker.spec import values

PRIORITY_CLASSES: dict[str, int] = values.PRIORITY_CLASSES


@dataclass(frozen=True, slots=True)
class AcceleratorChoice:
    name: str  # the built-in catalog's spelling when it knows the accelerator, else as written
    count: int  # per node (1 for a fraction of one GPU)
    fraction: float | None = None  # a share of one GPU (A100:0.5), for GPU sharing
    # The instance types the choice is tied to (`instance_type` named next to `accelerators`, as
    # SkyPilot honours it); empty: any node with these GPUs.
    instance_types: tuple[str, ...] = ()

    def on(self, instance_type: str | None) -> bool:
        """Whether a node of ``instance_type`` may hold this choice (None: a node whose type is not known)."""
        return not self.instance_types or instance_type is None or instance_type in self.instance_types


@dataclass(frozen=True, slots=True)
class CheckpointSpec:
    dir: str | None = None  # a local path or an s3:// gs:// az:// URL
    signal: str = "SIGUSR1"  # a signal name, always spelled SIGXXX
    grace: timedelta = timedelta(seconds=120)


@dataclass(frozen=True, slots=True)
class CloudScope:
    cloud: str  # aws, gcp, azure or local
    region: str | None = None


@dataclass(frozen=True, slots=True)
class TopologySpec:
    level: str = "any"  # node | placement_group | any
    required: bool = False


@dataclass(frozen=True, slots=True)
class BrokerSection:
    priority: int = PRIORITY_CLASSES["training"]
    deadline: datetime | timedelta | None = None  # absolute (UTC-aware), or a duration after submission
    work: timedelta | None = None
    max_price: float | None = None  # USD per hour for the whole gang
    clouds: tuple[CloudScope, ...] = ()  # empty: any cloud
    team: str = "default"
    checkpoint: CheckpointSpec = CheckpointSpec()
    topology: TopologySpec = TopologySpec()
    speed: tuple[tuple[str, float], ...] = ()  # relative training speed per accelerator, as stated
    gpu_memory: float | None = None  # GB of GPU memory per GPU share (fractional jobs)

    def deadline_at(self, submitted: datetime) -> datetime | None:
        if self.deadline is None:
            return None
        if isinstance(self.deadline, timedelta):
            return submitted + self.deadline
        return self.deadline


@dataclass(frozen=True)
class JobSpec:
    name: str
    run: str
    num_nodes: int = 1
    accelerators: tuple[AcceleratorChoice, ...] = ()  # alternatives, in the file's order
    instance_type: str | None = None
    use_spot: bool | None = None
    setup: str | None = None
    envs: dict[str, str] = field(default_factory=dict)
    workdir: str | None = None
    file_mounts: dict[str, Any] = field(default_factory=dict)
    broker: BrokerSection = BrokerSection()
    task_config: dict[str, Any] = field(default_factory=dict)  # the SkyPilot part as written, plus `name`
    source: str | None = None
    broker_config: dict[str, Any] = field(default_factory=dict)  # the `broker:` section as written
    cpus: str | None = None  # as SkyPilot writes them: "8" or "8+" vCPUs per node
    memory: str | None = None  # GB per node: "32" or "32+"
    instance_types: tuple[str, ...] = ()  # every alternative's instance_type, in the file's order
    resource_places: tuple[CloudScope, ...] = ()  # where `resources` pins the job (every alternative names a cloud)
    warnings: tuple[str, ...] = ()  # what validation let pass but changed: accelerator choices dropped

    @property
    def allowed_clouds(self) -> frozenset[str]:
        """The clouds the job may run on (empty: any): `broker.clouds`, narrowed by `resources`."""
        return frozenset(cloud for cloud, _ in self.allowed_regions)

    @property
    def allowed_regions(self) -> frozenset[tuple[str, str | None]]:
        """(cloud, region) pairs the job may run in, region None for any of the cloud's; empty: anywhere.
        `broker.clouds` and `resources` both limit it: a place must be allowed by each that names any."""
        return narrow(frozenset((c.cloud, c.region) for c in self.broker.clouds),
                      frozenset((c.cloud, c.region) for c in self.resource_places))

    @property
    def min_cpus(self) -> float | None:
        return _minimum(self.cpus)

    @property
    def min_memory_gb(self) -> float | None:
        return _minimum(self.memory)

    @property
    def gpus_per_node(self) -> int:
        return self.accelerators[0].count if self.accelerators else 0

    @property
    def accelerator(self) -> str | None:
        return self.accelerators[0].name if self.accelerators else None

    def resolved_workdir(self) -> Path | None:
        if self.workdir is None:
            return None
        base = Path(self.source).parent if self.source else Path.cwd()
        return (base / Path(self.workdir).expanduser()).resolve()

    def to_data(self) -> dict[str, Any]:
        """The job file as stored (JSON-safe): the SkyPilot part plus the ``broker:`` section as written."""
        data = copy.deepcopy(self.task_config)
        if self.broker_config:
            data["broker"] = copy.deepcopy(self.broker_config)
        return data


def narrow(first: frozenset[tuple[str, str | None]],
           second: frozenset[tuple[str, str | None]]) -> frozenset[tuple[str, str | None]]:
    """The places both scopes allow; an empty scope allows everywhere, a region None all of a cloud's."""
    if not first or not second:
        return first or second
    both: set[tuple[str, str | None]] = set()
    for cloud, region in first:
        for other_cloud, other_region in second:
            if cloud == other_cloud and (region is None or other_region is None or region == other_region):
                both.add((cloud, region if region is not None else other_region))
    return frozenset(both)


def place_allowed(scope: frozenset[tuple[str, str | None]], cloud: str, region: str) -> bool:
    return not scope or (cloud, None) in scope or (cloud, region) in scope


def _minimum(value: str | None) -> float | None:
    if value is None:
        return None
    try:
        return float(value.strip().rstrip("+").upper().removesuffix("GB"))
    except ValueError:
        return None


@dataclass(frozen=True)
class Pipeline:
    """A multi-document job file: SkyPilot's managed-jobs pipeline (``kind`` "chain": the stages run
    one after another, each on its own resources) or job group (``kind`` "group": they run together)."""

    name: str
    kind: str  # chain | group
    stages: tuple[JobSpec, ...]
    header: dict[str, Any] = field(default_factory=dict)
    source: str | None = None


def sky_task_config(spec: JobSpec) -> dict[str, Any]:
    """The SkyPilot task only (no ``broker:``), ready for ``sky.Task.from_yaml_config``."""
    return copy.deepcopy(spec.task_config)


@dataclass(frozen=True, slots=True)
class MarketOffer:
    """What a market (a trace, a price snapshot) sells: the job is judged against it, not a catalog."""

    cloud: str
    instance_type: str
    accelerator: str
    gpus: int


def market_offers(zones: Any) -> tuple[MarketOffer, ...]:
    """Offers from a trace's zones (``providers.trace.TraceZone``) or quotes with the same fields."""
    offers = {MarketOffer(z.cloud, z.key.instance_type if hasattr(z, "key") else z.instance_type, z.accelerator,
                          int(z.gpus_per_node)) for z in zones}
    return tuple(sorted(offers, key=lambda o: (o.cloud, o.instance_type)))
