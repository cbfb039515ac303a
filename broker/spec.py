"""The job file: a SkyPilot task YAML plus an optional ``broker:`` section.

``load_job_spec(path)`` returns a validated, immutable ``JobSpec`` or raises ``SpecError`` naming
the field, the line and what was expected. The SkyPilot part is judged by SkyPilot itself
(``sky.Task.from_yaml_config`` and its catalog, or the built-in catalog when SkyPilot's cannot be
fetched); the ``broker:`` section by pydantic models in ``broker.specfile.broker_section``.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from broker.specfile import values
from broker.specfile.broker_section import BrokerModel, validate_broker_section
from broker.specfile.catalog_check import CATALOG_TIMEOUT_SECONDS, check_catalog
from broker.specfile.errors import SpecError
from broker.specfile.resources import ResourceError, resource_alternatives
from broker.specfile.skypilot import validate_task
from broker.specfile.yaml_lines import LoadedYaml, format_path, json_safe, load_yaml

__all__ = [
    "CATALOG_TIMEOUT_SECONDS",
    "PRIORITY_CLASSES",
    "AcceleratorChoice",
    "BrokerSection",
    "CheckpointSpec",
    "CloudScope",
    "JobSpec",
    "SpecError",
    "job_spec_from_data",
    "load_job_spec",
    "parse_duration",
    "parse_job_spec",
    "sky_task_config",
]

PRIORITY_CLASSES: dict[str, int] = values.PRIORITY_CLASSES


def parse_duration(value: Any, field: str = "duration") -> timedelta:
    """``90s``, ``30m``, ``1.5h``, ``2d``, ``1w`` or a bare number of seconds."""
    try:
        return values.duration(value)
    except ValueError as exc:
        raise SpecError(str(exc), field) from None


@dataclass(frozen=True, slots=True)
class AcceleratorChoice:
    name: str  # the built-in catalog's spelling when it knows the accelerator, else as written
    count: int  # per node


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


def sky_task_config(spec: JobSpec) -> dict[str, Any]:
    """The SkyPilot task only (no ``broker:``), ready for ``sky.Task.from_yaml_config``."""
    return copy.deepcopy(spec.task_config)


def load_job_spec(path: str | Path, *, offline: bool = False,
                  catalog_timeout: float = CATALOG_TIMEOUT_SECONDS) -> JobSpec:
    path = Path(path)
    return parse_job_spec(read_job_file(path), source=str(path), offline=offline, catalog_timeout=catalog_timeout)


def read_job_file(path: Path) -> str:
    """The job file's text, or a SpecError naming the file."""
    try:
        return path.read_text()
    except FileNotFoundError:
        raise SpecError("no such file", source=str(path)) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise SpecError(f"cannot read the job file: {exc}", source=str(path)) from None


def parse_job_spec(text: str, source: str = "job file", *, now: datetime | None = None, offline: bool = False,
                   catalog_timeout: float = CATALOG_TIMEOUT_SECONDS) -> JobSpec:
    """Validate a job file's text.

    ``now`` (default: the current time) is what a deadline must come after. Instance types and
    accelerators are looked up in SkyPilot's catalog, or in the built-in one when SkyPilot's
    cannot be fetched within ``catalog_timeout`` seconds, or always when ``offline``.
    """
    doc = load_yaml(text, source)
    return _build(doc, source, now or datetime.now(UTC), offline, catalog_timeout)


def job_spec_from_data(data: dict[str, Any], source: str | None = None, *, offline: bool = False,
                       catalog_timeout: float = CATALOG_TIMEOUT_SECONDS) -> JobSpec:
    """A stored ``to_data()`` back into a ``JobSpec``.

    Validated as on submission, except that a deadline which has passed since is kept.
    """
    return _build(LoadedYaml(json_safe(data)), source or "stored job", None, offline, catalog_timeout)


def _build(doc: LoadedYaml, source: str, now: datetime | None, offline: bool, catalog_timeout: float) -> JobSpec:
    if not isinstance(doc.data, dict):
        got = "an empty file" if doc.data is None else f"{type(doc.data).__name__} {doc.data!r}"
        raise SpecError(f"expected a mapping (a SkyPilot task with `run:`) at the top level, got {got}",
                        line=1 if doc.data is not None else None, source=source)
    task = {k: v for k, v in doc.data.items() if k != "broker"}
    broker_data = doc.data.get("broker")
    section = validate_broker_section(broker_data, doc, source, now)
    if task.get("name") is None:
        task["name"] = Path(source).stem if source else "job"
    run = task.get("run")
    if run is None or (isinstance(run, str) and not run.strip()):
        # SkyPilot allows a task without `run` (a cluster that only runs setup); a broker job must do work.
        raise SpecError("required: the command the job runs on each node, e.g. `run: python train.py`",
                        field="run", line=doc.line_of(("run",)), source=source)
    validate_task(task, doc, source)
    try:
        alternatives = resource_alternatives(task)
    except ResourceError as exc:
        raise SpecError(str(exc), field=format_path(exc.path), line=doc.line_of(exc.path), source=source) from None
    check_catalog(alternatives, tuple(c for c, _ in section.clouds), doc, source, offline=offline,
                  timeout=catalog_timeout)
    accelerators: list[AcceleratorChoice] = []
    for alt in alternatives:
        for request in alt.accelerators:
            choice = AcceleratorChoice(_canonical(request.name), request.count)
            if choice not in accelerators:
                accelerators.append(choice)
    first = alternatives[0]
    return JobSpec(
        name=str(task["name"]),
        run=str(run),
        num_nodes=int(task.get("num_nodes") or 1),
        accelerators=tuple(accelerators),
        instance_type=first.instance_type,
        use_spot=first.use_spot,
        setup=task.get("setup"),
        envs={str(k): str(v) for k, v in (task.get("envs") or {}).items()},
        workdir=task.get("workdir") if isinstance(task.get("workdir"), str) else None,
        file_mounts=task.get("file_mounts") or {},
        broker=_section(section),
        task_config=task,
        source=source,
        broker_config=broker_data if isinstance(broker_data, dict) else {},
    )


def _canonical(name: str) -> str:
    from providers.catalog import canonical_accelerator

    return canonical_accelerator(name) or name


def _section(model: BrokerModel) -> BrokerSection:
    return BrokerSection(
        priority=model.priority,
        deadline=model.deadline,
        work=model.work,
        max_price=model.max_price,
        clouds=tuple(CloudScope(cloud, region) for cloud, region in model.clouds),
        team=model.team,
        checkpoint=CheckpointSpec(model.checkpoint.dir, model.checkpoint.signal, model.checkpoint.grace),
        topology=TopologySpec(model.topology.level, model.topology.required),
        speed=model.speed,
    )

