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
from broker.specfile.resources import ResourceAlternative, ResourceError, resource_alternatives
from broker.specfile.skypilot import validate_task
from broker.specfile.yaml_lines import MAX_FILE_BYTES, LoadedYaml, format_path, json_safe, load_yaml_documents

__all__ = [
    "CATALOG_TIMEOUT_SECONDS",
    "PRIORITY_CLASSES",
    "AcceleratorChoice",
    "BrokerSection",
    "CheckpointSpec",
    "CloudScope",
    "JobSpec",
    "MarketOffer",
    "Pipeline",
    "SpecError",
    "job_spec_from_data",
    "load_job_file",
    "load_job_spec",
    "load_pipeline",
    "market_offers",
    "parse_duration",
    "parse_job_file",
    "parse_job_spec",
    "sky_task_config",
]

PRIORITY_CLASSES: dict[str, int] = values.PRIORITY_CLASSES
MAX_NUM_NODES = 1024
# Accelerators that are not GPUs: SkyPilot knows them, the broker does not place them.
_NOT_GPUS = ("tpu", "inferentia", "trainium", "gaudi")


def parse_duration(value: Any, field: str = "duration") -> timedelta:
    """``90s``, ``30m``, ``1.5h``, ``2d``, ``1w`` or a bare number of seconds."""
    try:
        return values.duration(value)
    except ValueError as exc:
        raise SpecError(str(exc), field) from None


@dataclass(frozen=True, slots=True)
class AcceleratorChoice:
    name: str  # the built-in catalog's spelling when it knows the accelerator, else as written
    count: int  # per node (1 for a fraction of one GPU)
    fraction: float | None = None  # a share of one GPU (A100:0.5), for GPU sharing


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

    @property
    def gpu_fraction(self) -> float | None:
        """The share of one GPU the job asks for (``A100:0.5``), or None for whole GPUs."""
        return self.accelerators[0].fraction if self.accelerators else None

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


def load_job_spec(path: str | Path, *, offline: bool = False, catalog_timeout: float = CATALOG_TIMEOUT_SECONDS,
                  market: tuple[MarketOffer, ...] | None = None) -> JobSpec:
    """``market``: judge accelerators and instance types against what it offers (a ``--market`` run,
    ``broker simulate``) instead of a catalog: a job the market offers is never refused."""
    path = Path(path)
    return parse_job_spec(read_job_file(path), source=str(path), offline=offline, catalog_timeout=catalog_timeout,
                          market=market)


def load_job_file(path: str | Path, *, offline: bool = False,
                  catalog_timeout: float = CATALOG_TIMEOUT_SECONDS) -> JobSpec | Pipeline:
    """A one-task job file as a ``JobSpec``, a multi-document one as a ``Pipeline``."""
    path = Path(path)
    return parse_job_file(read_job_file(path), source=str(path), offline=offline, catalog_timeout=catalog_timeout)


def load_pipeline(path: str | Path, *, offline: bool = False,
                  catalog_timeout: float = CATALOG_TIMEOUT_SECONDS) -> Pipeline:
    loaded = load_job_file(path, offline=offline, catalog_timeout=catalog_timeout)
    if isinstance(loaded, JobSpec):
        return Pipeline(loaded.name, "chain", (loaded,), {}, loaded.source)
    return loaded


def read_job_file(path: Path) -> str:
    """The job file's text, or a SpecError naming the file."""
    try:
        with path.open("rb") as handle:
            raw = handle.read(MAX_FILE_BYTES + 1)
    except FileNotFoundError:
        raise SpecError("no such file", source=str(path)) from None
    except OSError as exc:
        raise SpecError(f"cannot read the job file: {exc}", source=str(path)) from None
    if len(raw) > MAX_FILE_BYTES:
        raise SpecError(f"the job file is over {MAX_FILE_BYTES:,} bytes; put large scripts in files under workdir",
                        source=str(path))
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = raw.count(b"\n", 0, exc.start) + 1
        raise SpecError(f"not UTF-8 text (byte {exc.start}): a job file is YAML text", line=line,
                        source=str(path)) from None


def parse_job_spec(text: str, source: str = "job file", *, now: datetime | None = None, offline: bool = False,
                   catalog_timeout: float = CATALOG_TIMEOUT_SECONDS,
                   market: tuple[MarketOffer, ...] | None = None) -> JobSpec:
    """Validate a job file's text.

    ``now`` (default: the current time) is what a deadline must come after. Instance types and
    accelerators are looked up in SkyPilot's catalog, or in the built-in one when SkyPilot's
    cannot be fetched within ``catalog_timeout`` seconds, or always when ``offline``.
    A multi-document file (a pipeline) is validated stage by stage, then refused: the broker does
    not run pipeline stages yet.
    """
    loaded = parse_job_file(text, source, now=now, offline=offline, catalog_timeout=catalog_timeout, market=market)
    if isinstance(loaded, Pipeline):
        what = "job group" if loaded.kind == "group" else "pipeline"
        names = ", ".join(stage.name for stage in loaded.stages)
        raise SpecError(f"a {what} of {len(loaded.stages)} stages ({names}): its stages are valid, but the broker "
                        "does not run pipelines yet; launch each stage as its own job file", source=source)
    return loaded


def parse_job_file(text: str, source: str = "job file", *, now: datetime | None = None, offline: bool = False,
                   catalog_timeout: float = CATALOG_TIMEOUT_SECONDS,
                   market: tuple[MarketOffer, ...] | None = None) -> JobSpec | Pipeline:
    documents = load_yaml_documents(text, source)
    when = now or datetime.now(UTC)
    if len(documents) == 1:
        return _build(documents[0], source, when, offline, catalog_timeout, market=market)
    return _pipeline(documents, source, when, offline, catalog_timeout)


def job_spec_from_data(data: dict[str, Any], source: str | None = None, *, offline: bool = False,
                       catalog_timeout: float = CATALOG_TIMEOUT_SECONDS) -> JobSpec:
    """A stored ``to_data()`` back into a ``JobSpec``.

    Validated as on submission, except that a deadline which has passed since is kept.
    """
    return _build(LoadedYaml(json_safe(data)), source or "stored job", None, offline, catalog_timeout)


_GROUP_HEADER_KEYS = frozenset({"name", "execution", "primary_tasks", "termination_delay", "inter_connection"})


def _pipeline(documents: list[LoadedYaml], source: str, now: datetime, offline: bool,
              catalog_timeout: float) -> Pipeline:
    """SkyPilot's rules: a first document holding only ``name`` (and ``execution: serial``) names a
    chain; one with ``execution: parallel`` heads a job group; every other document is a task."""
    first = documents[0]
    header: dict[str, Any] = {}
    kind = "chain"
    tasks = [d for d in documents if d.data is not None]
    if isinstance(first.data, dict):
        keys = set(first.data)
        if first.data.get("execution") == "parallel":
            kind, header, tasks = "group", dict(first.data), [d for d in documents[1:] if d.data is not None]
            unknown = sorted(keys - _GROUP_HEADER_KEYS)
            if unknown:
                raise _doc_error(first, (unknown[0],), source, f"unknown job group header key {unknown[0]!r}; "
                                 f"expected one of: {', '.join(sorted(_GROUP_HEADER_KEYS))}")
        elif keys in ({"name"}, {"name", "execution"}):
            execution = first.data.get("execution")
            if execution not in (None, "serial"):
                raise _doc_error(first, ("execution",), source,
                                 f"expected serial (a pipeline) or parallel (a job group), got {execution!r}")
            header, tasks = dict(first.data), [d for d in documents[1:] if d.data is not None]
    if not tasks:
        raise SpecError("the header names a pipeline but no task follows it", line=first.first_line, source=source)
    _validate_dag(documents, source)
    stages: list[JobSpec] = []
    name = str(header.get("name") or Path(source).stem)
    for index, doc in enumerate(tasks):
        stage_source = f"{source} (stage {index + 1})"
        spec = _build(doc, stage_source, now, offline, catalog_timeout, default_name=f"{name}-{index}")
        stages.append(spec)
    return Pipeline(name, kind, tuple(stages), header, source)


def _validate_dag(documents: list[LoadedYaml], source: str) -> None:
    """SkyPilot's own multi-document loader judges the structure (each task without ``broker:``)."""
    import yaml
    from sky import sky_logging
    from sky.utils import dag_utils

    configs = [{k: v for k, v in d.data.items() if k != "broker"} if isinstance(d.data, dict) else d.data
               for d in documents]
    try:
        with sky_logging.silent():
            dag_utils.load_dag_from_yaml_str(yaml.safe_dump_all(configs))
    except (ValueError, TypeError, KeyError, AssertionError, AttributeError) as exc:
        message = " ".join(str(exc).split()) or type(exc).__name__
        raise SpecError(f"SkyPilot: {message}", line=documents[0].first_line, source=source) from None


def _doc_error(doc: LoadedYaml, path: tuple[str | int, ...], source: str, message: str) -> SpecError:
    return SpecError(message, field=format_path(path), line=doc.line_of(path) or doc.first_line, source=source)


def _build(doc: LoadedYaml, source: str, now: datetime | None, offline: bool, catalog_timeout: float,
           default_name: str | None = None, market: tuple[MarketOffer, ...] | None = None) -> JobSpec:
    if not isinstance(doc.data, dict):
        got = "an empty file" if doc.data is None else f"{type(doc.data).__name__} {doc.data!r}"
        raise SpecError(f"expected a mapping (a SkyPilot task with `run:`) at the top level, got {got}",
                        line=doc.first_line if doc.data is not None else None, source=source)
    task = {k: v for k, v in doc.data.items() if k != "broker"}
    broker_data = doc.data.get("broker")
    section = validate_broker_section(broker_data, doc, source, now)
    if task.get("name") is None:
        task["name"] = default_name or (Path(source).stem if source else "job")
    name = str(task["name"])
    if len(name) > values.MAX_NAME_CHARS:
        raise SpecError(f"expected a name of at most {values.MAX_NAME_CHARS} characters, got {len(name)}",
                        field="name", line=doc.line_of(("name",)), source=source)
    num_nodes = task.get("num_nodes")
    if isinstance(num_nodes, int) and not isinstance(num_nodes, bool) and num_nodes > MAX_NUM_NODES:
        raise SpecError(f"expected at most {MAX_NUM_NODES} nodes, got {num_nodes:.3g}", field="num_nodes",
                        line=doc.line_of(("num_nodes",)), source=source)
    run = task.get("run")
    # SkyPilot runs a task without `run` too: it sets the nodes up (`setup`) and succeeds. A task
    # with neither would hold GPUs to do nothing: refused.
    if not _has_text(run) and not _has_text(task.get("setup")):
        raise SpecError("required: the command the job runs on each node, e.g. `run: python train.py` "
                        "(or a `setup:` for a task that only sets its nodes up)", field="run",
                        line=doc.line_of(("run",)) or doc.line_of(("setup",)), source=source)
    validate_task(task, doc, source)
    try:
        alternatives = resource_alternatives(task)
    except ResourceError as exc:
        raise SpecError(str(exc), field=format_path(exc.path), line=doc.line_of(exc.path), source=source) from None
    for alt in alternatives:
        for request in alt.accelerators:
            if request.name.lower().startswith(_NOT_GPUS):
                raise SpecError(f"{request.name} is not a GPU: the broker places GPUs and CPUs only "
                                "(run TPU, Inferentia and Trainium tasks with SkyPilot directly)",
                                field=format_path(request.path), line=doc.line_of(request.path), source=source)
            if request.fraction is not None and int(task.get("num_nodes") or 1) > 1:
                raise SpecError(f"a fraction of a GPU ({request.name}:{request.count:g}) is for one node; a gang of "
                                f"{task.get('num_nodes')} nodes needs whole GPUs", field=format_path(request.path),
                                line=doc.line_of(request.path), source=source)
    if market is not None:
        _check_market(alternatives, market, doc, source)
    else:
        check_catalog(alternatives, tuple(c for c, _ in section.clouds), doc, source, offline=offline,
                      timeout=catalog_timeout)
    accelerators: list[AcceleratorChoice] = []
    for alt in alternatives:
        requests = [(r.name, r.count) for r in alt.accelerators] or _inferred(alt.instance_type, alt.cloud)
        for acc_name, count in requests:
            fraction = None if float(count).is_integer() else float(count)
            choice = AcceleratorChoice(_canonical(acc_name), 1 if fraction else int(count), fraction)
            if choice not in accelerators:
                accelerators.append(choice)
    first = alternatives[0]
    return JobSpec(
        name=name,
        run="" if run is None else str(run),
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
        cpus=first.cpus,
        memory=first.memory,
        instance_types=tuple(dict.fromkeys(a.instance_type for a in alternatives if a.instance_type)),
    )


def _check_market(alternatives: list[ResourceAlternative], market: tuple[MarketOffer, ...], doc: LoadedYaml,
                  source: str) -> None:
    """Refuse a job no alternative of which the market offers (an accelerator at a count a node of
    the market has, or an instance type it sells); a job it offers passes whatever the catalogs say."""
    sold = {(o.accelerator.lower(), o.gpus) for o in market}
    types = {o.instance_type for o in market}
    for alt in alternatives:
        if alt.instance_type and alt.instance_type in types:
            return
        if not alt.accelerators and not alt.instance_type:
            return  # a CPU task: no accelerator to match
        for request in alt.accelerators:
            count = 1 if request.fraction is not None else int(request.count)
            if any(name == request.name.lower() and count <= gpus for name, gpus in sold):
                return
    first = alternatives[0]
    path = first.accelerators[0].path if first.accelerators else (*first.path, "instance_type")
    wanted = ", ".join(f"{r.name}:{r.count:g}" for a in alternatives for r in a.accelerators) or \
        ", ".join(a.instance_type for a in alternatives if a.instance_type)
    have = ", ".join(sorted({f"{o.accelerator}:{o.gpus} ({o.instance_type})" for o in market}))
    raise SpecError(f"the market has no rows for accelerators {wanted}; it has {have or 'nothing'}",
                    field=format_path(path),
                    line=doc.line_of(path), source=source)


def _has_text(value: Any) -> bool:
    return value is not None and (not isinstance(value, str) or bool(value.strip()))


def _inferred(instance_type: str | None, cloud: str | None) -> list[tuple[str, float]]:
    """The GPUs an instance type carries (``a3-highgpu-8g`` -> H100 x 8), as SkyPilot resolves them."""
    if not instance_type:
        return []
    from providers.catalog import find_any

    entry = find_any(instance_type, cloud)
    return [(entry.accelerator, entry.gpus)] if entry is not None and entry.gpus > 0 else []


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
        gpu_memory=model.gpu_memory,
    )

