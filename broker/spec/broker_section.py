"""The ``broker:`` section, validated with pydantic; its errors become ``SpecError``s with field and line."""

from __future__ import annotations

import difflib
from datetime import datetime, timedelta
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, ValidationError, ValidationInfo, field_validator

from broker.errors import UserError
from broker.spec import values
from broker.spec.errors import SpecError
from broker.spec.yaml_lines import LoadedYaml, Path, format_path


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class CheckpointModel(_Section):
    dir: str | None = None
    signal: str = "SIGUSR1"
    grace: timedelta = timedelta(seconds=120)

    @field_validator("dir", mode="before")
    @classmethod
    def _check_dir(cls, value: Any) -> str | None:
        return None if value is None else values.checkpoint_dir(value)

    @field_validator("signal", mode="before")
    @classmethod
    def _check_signal(cls, value: Any) -> str:
        return values.signal_name(value)

    @field_validator("grace", mode="before")
    @classmethod
    def _check_grace(cls, value: Any) -> timedelta:
        return values.duration(value)


class TopologyModel(_Section):
    """Where a gang's GPUs must (``required``) or should sit: one node, one placement group, anywhere."""

    level: Literal["node", "placement_group", "any"] = "any"
    required: bool = False


class BrokerModel(_Section):
    priority: int = values.PRIORITY_CLASSES["training"]
    deadline: datetime | timedelta | None = None
    work: timedelta | None = None
    max_price: float | None = None
    clouds: tuple[tuple[str, str | None], ...] = ()
    team: str = "default"
    checkpoint: CheckpointModel = CheckpointModel()
    topology: TopologyModel = TopologyModel()
    speed: tuple[tuple[str, float], ...] = ()  # relative training speed per accelerator (policies.speed)

    @field_validator("speed", mode="before")
    @classmethod
    def _check_speed(cls, value: Any) -> tuple[tuple[str, float], ...]:
        return _speeds(value)

    gpu_memory: float | None = None  # GB per GPU share, for a job asking for a fraction of a GPU

    @field_validator("gpu_memory", mode="before")
    @classmethod
    def _check_gpu_memory(cls, value: Any) -> float | None:
        return None if value is None else values.gpu_memory(value)

    @field_validator("priority", mode="before")
    @classmethod
    def _check_priority(cls, value: Any) -> int:
        return values.priority(value)

    @field_validator("work", mode="before")
    @classmethod
    def _check_work(cls, value: Any) -> timedelta | None:
        return None if value is None else values.duration(value)

    @field_validator("max_price", mode="before")
    @classmethod
    def _check_max_price(cls, value: Any) -> float | None:
        return None if value is None else values.max_price(value)

    @field_validator("team", mode="before")
    @classmethod
    def _check_team(cls, value: Any) -> str:
        return values.team(value)

    @field_validator("deadline", mode="before")
    @classmethod
    def _check_deadline(cls, value: Any, info: ValidationInfo) -> datetime | timedelta | None:
        if value is None:
            return None
        now = info.context.get("now") if info.context else None
        return values.deadline(value, now)

    @field_validator("clouds", mode="before")
    @classmethod
    def _check_clouds(cls, value: Any) -> tuple[tuple[str, str | None], ...]:
        items = [value] if isinstance(value, str) else value
        if not isinstance(items, list | tuple):
            raise ValueError(f"expected a list of clouds like [aws, gcp/us-central1], got {value!r}")
        scopes: list[tuple[str, str | None]] = []
        for index, item in enumerate(items):
            try:
                scope = values.cloud_scope(item)
            except ValueError as exc:
                raise _ItemError(index, str(exc)) from None
            if scope not in scopes:
                scopes.append(scope)
        return tuple(scopes)


def _speeds(value: Any) -> tuple[tuple[str, float], ...]:
    from policies.speed import MAX_SPEED
    from providers.catalog import ACCELERATORS, canonical_accelerator

    expected = "expected a mapping of accelerator to relative training speed, e.g. {H100: 2.1, A100-80GB: 1.0}"
    if not isinstance(value, dict):
        raise ValueError(f"{expected}, got {repr(value)[:80]}")
    if len(value) > len(ACCELERATORS):
        raise ValueError(f"{expected}, got {len(value)} entries (there are {len(ACCELERATORS)} accelerators)")
    speeds: dict[str, float] = {}
    for name, speed in value.items():
        known = canonical_accelerator(name) if isinstance(name, str) else None
        if known is None:
            raise ValueError(f"unknown accelerator {repr(name)[:80]}; "
                             f"expected one of {', '.join(sorted(ACCELERATORS))}")
        if isinstance(speed, bool) or not isinstance(speed, int | float) or not 0 < speed <= MAX_SPEED:
            raise ValueError(f"{known}: expected a relative speed, a number > 0 and <= {MAX_SPEED:g}, "
                             f"got {repr(speed)[:80]}")
        speeds[known] = float(speed)
    return tuple(speeds.items())


class _ItemError(UserError, ValueError):
    """A bad list item: carries its index so the error can point at the item's own line."""

    def __init__(self, index: int, message: str) -> None:
        super().__init__(message)
        self.index = index


_MODELS_AT: dict[tuple[str, ...], type[BaseModel]] = {(): BrokerModel, ("checkpoint",): CheckpointModel,
                                                      ("topology",): TopologyModel}
SECTION_KEYS: tuple[str, ...] = tuple(BrokerModel.model_fields)


def validate_broker_section(data: Any, doc: LoadedYaml, source: str, now: datetime | None) -> BrokerModel:
    """``data`` is the section as written (None when absent). ``now`` None skips the past-deadline check."""
    if data is None:
        return BrokerModel()
    try:
        return BrokerModel.model_validate(data, context={"now": now})
    except ValidationError as exc:
        raise _to_spec_error(exc, doc, source) from None


def _to_spec_error(exc: ValidationError, doc: LoadedYaml, source: str) -> SpecError:
    error = exc.errors(include_url=False)[0]
    loc: Path = tuple(error["loc"])
    kind, given = error["type"], error.get("input")
    if kind == "extra_forbidden":
        model = _MODELS_AT.get(tuple(str(p) for p in loc[:-1]), BrokerModel)
        allowed = list(model.model_fields)
        message = f"unknown key {loc[-1]!r}; expected one of: {', '.join(allowed)}"
        close = difflib.get_close_matches(str(loc[-1]), allowed, n=1)
        if close:
            message += f" (did you mean {close[0]!r}?)"
    elif kind == "value_error":
        cause = error.get("ctx", {}).get("error")
        if isinstance(cause, _ItemError):
            loc = (*loc, cause.index)
        message = str(error["msg"]).removeprefix("Value error, ")
    elif kind in ("model_type", "model_attributes_type", "dict_type"):
        model = _MODELS_AT.get(tuple(str(p) for p in loc), BrokerModel)
        message = f"expected a mapping with keys {', '.join(model.model_fields)}, got {given!r}"
    else:
        message = f"{error['msg']}, got {given!r}"
    extra = exc.error_count() - 1
    if extra:
        message += f" (and {extra} more problem{'s' if extra > 1 else ''} in the broker section)"
    path: Path = ("broker", *loc)
    return SpecError(message, field=format_path(path), line=doc.line_of(path), source=source)
