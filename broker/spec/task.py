"""One task document of a job file into a ``JobSpec``: the ``broker:`` section by its pydantic model,
the SkyPilot part by SkyPilot's schema and (``skypilot``) by SkyPilot itself, the accelerators against a
catalog or the given market."""

from __future__ import annotations

import dataclasses
from datetime import datetime
from pathlib import Path
from typing import Any

from broker.spec import values
from broker.spec.broker_section import BrokerModel, validate_broker_section
from broker.spec.catalog_check import DroppedChoice, check_catalog
from broker.spec.errors import SpecError
from broker.spec.model import (
    AcceleratorChoice,
    BrokerSection,
    CheckpointSpec,
    CloudScope,
    JobSpec,
    MarketOffer,
    TopologySpec,
    narrow,
)
from broker.spec.resources import ResourceAlternative, ResourceError, resource_alternatives
from broker.spec.skypilot import check_schema, validate_task
from broker.spec.yaml_lines import LoadedYaml, format_path

MAX_NUM_NODES = 1024
# Accelerators that are not GPUs: SkyPilot knows them, the broker does not place them.
_NOT_GPUS = ("tpu", "inferentia", "trainium", "gaudi")


def build_task(doc: LoadedYaml, source: str, now: datetime | None, offline: bool, catalog_timeout: float,
           default_name: str | None = None, market: tuple[MarketOffer, ...] | None = None,
           skypilot: bool = True) -> JobSpec:
    """``skypilot``: judge the file by SkyPilot itself and its catalog too (imports SkyPilot: seconds).
    Without, by SkyPilot's schema and the built-in catalog only: for a backend that never hands the
    task to SkyPilot (the local one)."""
    offline = offline or not skypilot
    if not isinstance(doc.data, dict):
        got = "an empty file" if doc.data is None else f"{type(doc.data).__name__} {doc.data!r}"
        raise SpecError(f"expected a mapping (a SkyPilot task with `run:`) at the top level, got {got}",
                        line=doc.first_line if doc.data is not None else None, source=source)
    # An empty `envs:` (its entries commented out) is no variables; SkyPilot's own reading crashes on it.
    task = {k: v for k, v in doc.data.items() if k != "broker" and not (k == "envs" and v is None)}
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
    # The broker's own checks first, SkyPilot's last: importing SkyPilot takes seconds, and a file the
    # broker can refuse by itself is refused without it: SkyPilot's schema is among those checks (the
    # broker's copy of it, SkyPilot's words). A shape the broker's reading does not take otherwise is
    # left to SkyPilot, which says why in its own words.
    check_schema(task, doc, source)
    try:
        alternatives = resource_alternatives(task)
    except ResourceError as exc:
        if skypilot:
            validate_task(task, doc, source)  # SkyPilot's message, where it has one, as before
        raise SpecError(str(exc), field=format_path(exc.path), line=doc.line_of(exc.path), source=source) from None
    except (TypeError, ValueError, AttributeError, KeyError):
        if skypilot:
            validate_task(task, doc, source)
        raise
    for alt in alternatives:
        for request in alt.accelerators:
            if request.name.lower().startswith(_NOT_GPUS):
                raise SpecError(f"{request.name} is not a GPU: the broker places GPUs and CPUs only "
                                "(run TPU, Inferentia and Trainium tasks with SkyPilot directly)",
                                field=format_path(request.path), line=doc.line_of(request.path), source=source)
    if skypilot:
        validate_task(task, doc, source)
    # A fraction per node in a gang of several nodes (SkyPilot's job-queue examples: T4:0.5 on 2 nodes)
    # is one share of one GPU on each node, all of the same type: SkyPilot judged it above.
    warnings: tuple[str, ...] = ()
    if market is not None:
        _check_market(alternatives, market, doc, source)
        dropped = _unquoted_unsold(alternatives, market, tuple(c for c, _ in section.clouds), doc, source,
                                   offline, catalog_timeout)
        alternatives, warnings = _without(alternatives, dropped)
    else:
        dropped = check_catalog(alternatives, tuple(c for c, _ in section.clouds), doc, source, offline=offline,
                                timeout=catalog_timeout)
        alternatives, warnings = _without(alternatives, dropped)
    accelerators = _choices(alternatives, market)
    first = alternatives[0]
    return JobSpec(
        name=name,
        run="" if run is None else str(run),
        num_nodes=int(task.get("num_nodes") or 1),
        accelerators=accelerators,
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
        resource_places=_resource_places(alternatives, section, doc, source),
        warnings=warnings,
    )


def _choices(alternatives: list[ResourceAlternative],
             market: tuple[MarketOffer, ...] | None) -> tuple[AcceleratorChoice, ...]:
    """One choice per accelerator and count, in the file's order. An alternative naming both
    `instance_type` and `accelerators` ties its choices to that type, as SkyPilot provisions just it;
    the same accelerator and count from an alternative without a type (or with a type only, whose GPUs
    are inferred) stays placeable anywhere, so a file mixing the two keeps both placeable."""
    tied: dict[tuple[str, int, float | None], tuple[str, ...] | None] = {}  # None: on any node
    for alt in alternatives:
        requests = [(r.name, r.count) for r in alt.accelerators] or _inferred(alt.instance_type, alt.cloud, market)
        types = (alt.instance_type,) if alt.instance_type and alt.accelerators else None
        for acc_name, count in requests:
            fraction = None if float(count).is_integer() else float(count)
            key = (_canonical(acc_name), 1 if fraction else int(count), fraction)
            if key not in tied:
                tied[key] = types
            elif tied[key] is not None:
                tied[key] = None if types is None else tuple(dict.fromkeys((*(tied[key] or ()), *types)))
    return tuple(AcceleratorChoice(*key, instance_types=types or ()) for key, types in tied.items())


def _without(alternatives: list[ResourceAlternative],
             dropped: list[DroppedChoice]) -> tuple[list[ResourceAlternative], tuple[str, ...]]:
    """The alternatives less the dropped accelerator choices (an alternative left with none goes too),
    and one warning per dropped choice naming it and what the job keeps."""
    if not dropped:
        return alternatives, ()
    gone = {id(d.request) for d in dropped}
    kept = []
    for alt in alternatives:
        left = tuple(r for r in alt.accelerators if id(r) not in gone)
        if left or not alt.accelerators:
            kept.append(dataclasses.replace(alt, accelerators=left))
    names = ", ".join(dict.fromkeys(f"{r.name}:{r.count:g}" for a in kept for r in a.accelerators)) or \
        ", ".join(dict.fromkeys(a.instance_type or "CPU" for a in kept))
    warnings = tuple(d.warning(names) for d in dropped)
    return kept, warnings


def _resource_places(alternatives: list[ResourceAlternative], section: BrokerModel, doc: LoadedYaml,
                     source: str) -> tuple[CloudScope, ...]:
    """Where `resources` pins the job: each alternative's cloud and region, when every alternative names
    a cloud the broker places on (a Kubernetes or Lambda alternative leaves the job unpinned, as before).
    A file whose `resources` and `broker.clouds` allow no place in common is refused."""
    if any(alt.cloud not in values.CLOUDS for alt in alternatives):
        return ()
    places = tuple(dict.fromkeys(CloudScope(str(alt.cloud), alt.region) for alt in alternatives))
    scoped = frozenset((cloud, region) for cloud, region in section.clouds)
    if scoped and not narrow(scoped, frozenset((p.cloud, p.region) for p in places)):
        path = (*alternatives[0].path, "cloud")
        named = ", ".join(p.cloud + (f"/{p.region}" if p.region else "") for p in places)
        allowed = ", ".join(sorted(c + (f"/{r}" if r else "") for c, r in scoped))
        raise SpecError(f"resources name {named} but broker.clouds allows only {allowed}: the job could run nowhere",
                        field=format_path(path), line=doc.line_of(path), source=source)
    return places


def _check_market(alternatives: list[ResourceAlternative], market: tuple[MarketOffer, ...], doc: LoadedYaml,
                  source: str) -> None:
    """Refuse a job no alternative of which the market offers (an accelerator at a count a node of
    the market has, or an instance type it sells); a job it offers passes whatever the catalogs say."""
    for alt in alternatives:
        offers = [o for o in market if alt.cloud is None or o.cloud == alt.cloud]
        if alt.instance_type:  # a named type is offered only where it is sold, whatever its GPUs
            if any(o.instance_type == alt.instance_type for o in offers):
                return
            continue
        if not alt.accelerators:
            return  # a CPU task: no accelerator to match
        sold = {(o.accelerator.lower(), o.gpus) for o in offers}
        for request in alt.accelerators:
            count = 1 if request.fraction is not None else int(request.count)
            if any(name == request.name.lower() and count <= gpus for name, gpus in sold):
                return
    first = alternatives[0]
    path = (*first.path, "instance_type") if first.instance_type else first.accelerators[0].path
    types = ", ".join(a.instance_type for a in alternatives if a.instance_type)
    wanted = f"instance type {types}" if types else \
        "accelerators " + ", ".join(f"{r.name}:{r.count:g}" for a in alternatives for r in a.accelerators)
    have = ", ".join(sorted({f"{o.accelerator}:{o.gpus} ({o.instance_type})" for o in market}))
    raise SpecError(f"the market has no rows for {wanted}; it has {have or 'nothing'}",
                    field=format_path(path),
                    line=doc.line_of(path), source=source)


def _unquoted_unsold(alternatives: list[ResourceAlternative], market: tuple[MarketOffer, ...],
                     allowed_clouds: tuple[str, ...], doc: LoadedYaml, source: str, offline: bool,
                     timeout: float) -> list[DroppedChoice]:
    """The accelerator choices of a job the market holds that the market does not quote and no catalog
    knows (L40 in {L4, L40, A10G} on a price book quoting L4 and A10G): dropped as on the catalog
    path. A choice the market does not quote but a catalog knows stays (the book may not have polled
    it yet); so does every choice of an alternative tied to an instance type (the market judged it)."""
    quoted = {(o.cloud, o.accelerator.lower()) for o in market}
    rest = []
    for alt in alternatives:
        if alt.instance_type:
            continue
        left = tuple(r for r in alt.accelerators
                     if not any(name == r.name.lower() and alt.cloud in (None, cloud) for cloud, name in quoted))
        if left:
            rest.append(dataclasses.replace(alt, accelerators=left, region=None, zone=None))
    if not rest:
        return []
    return check_catalog(rest, allowed_clouds, doc, source, offline=offline, timeout=timeout, others_left=True)


def _has_text(value: Any) -> bool:
    return value is not None and (not isinstance(value, str) or bool(value.strip()))


def _inferred(instance_type: str | None, cloud: str | None,
              market: tuple[MarketOffer, ...] | None = None) -> list[tuple[str, float]]:
    """The GPUs an instance type carries (``a3-highgpu-8g`` -> H100 x 8), as SkyPilot resolves them;
    for a type the catalog lacks, as the market quotes it."""
    if not instance_type:
        return []
    quoted = [(o.accelerator, float(o.gpus)) for o in market or ()
              if o.instance_type == instance_type and o.gpus > 0 and (cloud is None or o.cloud == cloud)]
    from providers.catalog import find_any

    entry = find_any(instance_type, cloud)
    if entry is None:
        return quoted[:1]
    return [(entry.accelerator, entry.gpus)] if entry.gpus > 0 else []


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
        gpu_memory=model.gpu_memory,
    )

