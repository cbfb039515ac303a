"""The job file: a SkyPilot task YAML plus an optional ``broker:`` section.

``load_job_spec(path)`` returns a validated, immutable ``JobSpec`` or raises ``SpecError`` naming
the field, the line and what was expected.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import yaml

PRIORITY_CLASSES: dict[str, int] = {"inference": 1000, "training": 500, "batch": 100}


class SpecError(ValueError):
    """An invalid job file. ``str()`` is the message shown to the user."""

    def __init__(self, message: str, field: str | None = None, line: int | None = None,
                 source: str | None = None) -> None:
        self.field, self.line, self.source, self.detail = field, line, source, message
        where = source or "job file"
        if line is not None:
            where += f":{line}"
        super().__init__(f"{where}: {field + ': ' if field else ''}{message}")


_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(s|sec|m|min|h|hr|d|w)?\s*$", re.IGNORECASE)
_UNIT_SECONDS = {"s": 1, "sec": 1, "m": 60, "min": 60, "h": 3600, "hr": 3600, "d": 86400, "w": 604800}


def parse_duration(value: Any, field: str = "duration") -> timedelta:
    """``90s``, ``30m``, ``1.5h``, ``2d`` or a bare number of seconds."""
    if isinstance(value, int | float) and not isinstance(value, bool):
        seconds = float(value)
    else:
        match = _DURATION.match(str(value))
        if not match:
            raise SpecError(f"expected a duration like 90s, 30m, 1.5h or 2d, got {value!r}", field)
        seconds = float(match.group(1)) * _UNIT_SECONDS[(match.group(2) or "s").lower()]
    if seconds <= 0:
        raise SpecError(f"expected a positive duration, got {value!r}", field)
    return timedelta(seconds=seconds)


@dataclass(frozen=True, slots=True)
class AcceleratorChoice:
    name: str
    count: int  # per node


@dataclass(frozen=True, slots=True)
class CheckpointSpec:
    dir: str | None = None
    signal: str = "SIGUSR1"
    grace: timedelta = timedelta(seconds=120)


@dataclass(frozen=True, slots=True)
class CloudScope:
    cloud: str
    region: str | None = None


@dataclass(frozen=True, slots=True)
class BrokerSection:
    priority: int = PRIORITY_CLASSES["training"]
    deadline: datetime | timedelta | None = None  # absolute, or a duration after submission
    work: timedelta | None = None
    max_price: float | None = None  # USD per hour for the whole gang
    clouds: tuple[CloudScope, ...] = ()
    team: str = "default"
    checkpoint: CheckpointSpec = CheckpointSpec()

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
    task_config: dict[str, Any] = field(default_factory=dict)  # the SkyPilot part, as written
    source: str | None = None

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
        """The job file as stored: the SkyPilot part plus the ``broker:`` section as written."""
        return dict(self.task_config)


def load_job_spec(path: str | Path) -> JobSpec:
    path = Path(path)
    if not path.exists():
        raise SpecError("no such file", source=str(path))
    return parse_job_spec(path.read_text(), source=str(path))


def parse_job_spec(text: str, source: str = "job file") -> JobSpec:
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        raise SpecError(f"not valid YAML: {getattr(exc, 'problem', exc)}", line=mark.line + 1 if mark else None,
                        source=source) from None
    if not isinstance(data, dict):
        raise SpecError("expected a mapping (a SkyPilot task) at the top level", source=source)
    broker_data = data.pop("broker", None) or {}
    if not data.get("run"):
        raise SpecError("required: the command to run", field="run", source=source)
    resources = data.get("resources") or {}
    accelerators: list[AcceleratorChoice] = []
    acc = resources.get("accelerators")
    if isinstance(acc, str):
        name, _, count = acc.partition(":")
        accelerators.append(AcceleratorChoice(name, int(count or 1)))
    elif isinstance(acc, dict):
        accelerators.extend(AcceleratorChoice(k, int(v)) for k, v in acc.items())
    checkpoint = broker_data.get("checkpoint") or {}
    section = BrokerSection(
        priority=PRIORITY_CLASSES.get(str(broker_data.get("priority", "training")), 500),
        deadline=parse_duration(broker_data["deadline"], "broker.deadline") if "deadline" in broker_data else None,
        work=parse_duration(broker_data["work"], "broker.work") if "work" in broker_data else None,
        max_price=broker_data.get("max_price"),
        clouds=tuple(CloudScope(*str(c).split("/", 1)) for c in broker_data.get("clouds", [])),
        team=str(broker_data.get("team", "default")),
        checkpoint=CheckpointSpec(
            dir=checkpoint.get("dir"),
            signal=checkpoint.get("signal", "SIGUSR1"),
            grace=parse_duration(checkpoint.get("grace", 120), "broker.checkpoint.grace"),
        ),
    )
    task_config = dict(data)
    if broker_data:
        task_config["broker"] = broker_data
    return JobSpec(
        name=str(data.get("name") or Path(source).stem),
        run=str(data["run"]),
        num_nodes=int(data.get("num_nodes", 1)),
        accelerators=tuple(accelerators),
        instance_type=resources.get("instance_type"),
        use_spot=resources.get("use_spot"),
        setup=data.get("setup"),
        envs={str(k): str(v) for k, v in (data.get("envs") or {}).items()},
        workdir=data.get("workdir"),
        file_mounts=data.get("file_mounts") or {},
        broker=section,
        task_config=task_config,
        source=source,
    )
