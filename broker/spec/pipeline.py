"""A multi-document job file: SkyPilot's managed-jobs pipeline (a chain of stages) or job group."""

from __future__ import annotations

from datetime import datetime
from pathlib import Path
from typing import Any

from broker.spec.errors import SpecError
from broker.spec.model import JobSpec, Pipeline
from broker.spec.task import build_task
from broker.spec.yaml_lines import MAX_STAGES, LoadedYaml, format_path

_GROUP_HEADER_KEYS = frozenset({"name", "execution", "primary_tasks", "termination_delay", "inter_connection"})


def build_pipeline(documents: list[LoadedYaml], source: str, now: datetime, offline: bool,
              catalog_timeout: float, skypilot: bool = True) -> Pipeline:
    """SkyPilot's rules: a first document holding only ``name`` (and ``execution: serial``) names a
    chain; one with ``execution: parallel`` heads a job group; every other document is a task.
    SkyPilot judges the structure whatever ``skypilot`` says (the broker has no copy of those rules);
    ``skypilot`` is for the tasks (``build_task``)."""
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
    if len(tasks) > MAX_STAGES:
        raise SpecError(f"{len(tasks)} tasks: a pipeline has at most {MAX_STAGES} stages",
                        line=tasks[MAX_STAGES].first_line, source=source)
    _validate_dag(documents, source)
    stages: list[JobSpec] = []
    name = str(header.get("name") or Path(source).stem)
    for index, doc in enumerate(tasks):
        stage_source = f"{source} (stage {index + 1})"
        spec = build_task(doc, stage_source, now, offline, catalog_timeout, default_name=f"{name}-{index}",
                          skypilot=skypilot)
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
        field = next((key for key in ("primary_tasks", "name") if key in message), None)  # what SkyPilot judged
        raise SpecError(f"SkyPilot: {message}", field=field, line=documents[0].first_line, source=source) from None


def _doc_error(doc: LoadedYaml, path: tuple[str | int, ...], source: str, message: str) -> SpecError:
    return SpecError(message, field=format_path(path), line=doc.line_of(path) or doc.first_line, source=source)
