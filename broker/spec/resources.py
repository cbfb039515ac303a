"""The ``resources:`` of a task as a list of alternatives, each with where it sits in the file."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from broker.errors import UserError
from broker.spec.yaml_lines import Path

MAX_GPUS_PER_NODE = 64  # no cloud sells more per node (GCP a2-megagpu-16g has 16)


class ResourceError(UserError, ValueError):
    """A resources value the broker cannot use, and where it is."""

    def __init__(self, message: str, path: Path) -> None:
        super().__init__(message)
        self.path = path


@dataclass(frozen=True, slots=True)
class AcceleratorRequest:
    name: str  # as written
    count: float  # per node: a whole number, or a fraction below 1 (a share of one GPU)
    path: Path

    @property
    def fraction(self) -> float | None:
        return None if float(self.count).is_integer() else float(self.count)


@dataclass(frozen=True, slots=True)
class ResourceAlternative:
    path: Path
    cloud: str | None
    region: str | None
    zone: str | None
    instance_type: str | None
    use_spot: bool | None
    accelerators: tuple[AcceleratorRequest, ...]
    cpus: str | None = None
    memory: str | None = None


def resource_alternatives(config: dict[str, Any]) -> list[ResourceAlternative]:
    """``resources`` with ``any_of``/``ordered`` expanded over the shared keys, in the file's order."""
    resources = config.get("resources") or {}
    if isinstance(resources, list):  # SkyPilot also takes a bare list of resource dicts
        return [_alternative(r or {}, ("resources", i)) for i, r in enumerate(resources)]
    base = {k: v for k, v in resources.items() if k not in ("any_of", "ordered")}
    for key in ("any_of", "ordered"):
        if resources.get(key):
            alternatives = []
            for index, override in enumerate(resources[key]):
                merged = {**base, **(override or {})}
                alternatives.append(_alternative(merged, ("resources", key, index),
                                                 own=set((override or {}).keys())))
            return alternatives
    return [_alternative(base, ("resources",))]


def _alternative(resources: dict[str, Any], path: Path, own: set[str] | None = None) -> ResourceAlternative:
    def key_path(key: str) -> Path:
        # A key shared from the base of any_of/ordered sits under resources, not under the item.
        return (*path, key) if own is None or key in own else ("resources", key)

    cloud, region, zone = _placement(resources)
    accelerators = tuple(_accelerators(resources.get("accelerators"), key_path("accelerators")))
    return ResourceAlternative(path, cloud, region, zone, _str_or_none(resources.get("instance_type")),
                               resources.get("use_spot"), accelerators, _str_or_none(resources.get("cpus")),
                               _str_or_none(resources.get("memory")))


def _placement(resources: dict[str, Any]) -> tuple[str | None, str | None, str | None]:
    infra = resources.get("infra")
    if isinstance(infra, str) and infra.strip() and not infra.startswith("*"):
        parts = infra.strip().split("/")
        cloud = parts[0].lower()
        if cloud in ("k8s", "kubernetes", "ssh", "slurm"):  # their "regions" are contexts, not catalog regions
            return cloud, None, None
        return cloud, _part(parts, 1), _part(parts, 2)
    named = _str_or_none(resources.get("cloud"))
    return (named.lower() if named else None, _str_or_none(resources.get("region")),
            _str_or_none(resources.get("zone")))


def _part(parts: list[str], index: int) -> str | None:
    return parts[index] if len(parts) > index and parts[index] not in ("", "*") else None


def _str_or_none(value: Any) -> str | None:
    return None if value is None else str(value)


def _accelerators(value: Any, path: Path) -> list[AcceleratorRequest]:
    """Every form SkyPilot reads: ``H100``, ``H100:8``, ``{H100: 8}``, a set ``{L4, A10G}`` (a mapping
    with null values), a list (ordered alternatives), and the inline strings ``"{L4, A10G}"``/``"[...]"``."""
    if value is None:
        return []
    if isinstance(value, str):
        text = value.strip()
        if text.startswith("{") or text.startswith("["):
            items = [i for i in text.strip("{}[]").split(",") if i.strip()]
            return [_one(item, path) for item in items]
        return [_one(text, path)]
    if isinstance(value, dict):
        # SkyPilot writes `{NAME: null}` as NAME (one GPU) and `{NAME: COUNT}` as NAME:COUNT.
        return [_one(str(name), (*path, str(name))) if count is None else _counted(str(name), count, (*path, str(name)))
                for name, count in value.items()]
    if isinstance(value, list):
        out: list[AcceleratorRequest] = []
        for index, item in enumerate(value):
            if isinstance(item, list):
                raise ResourceError(f"expected an accelerator like V100:2 as list item, got {item!r}", (*path, index))
            out.extend(_accelerators(item, (*path, index)))  # a string, or {NAME: COUNT} as SkyPilot allows
        return out
    raise ResourceError(f"expected an accelerator like V100:2, {{V100: 2}} or a list of them, got {value!r}", path)


def _one(text: str, path: Path) -> AcceleratorRequest:
    name, sep, count = text.strip().partition(":")
    return _counted(name.strip(), count.strip() if sep else 1, path)


def _counted(name: str, count: Any, path: Path) -> AcceleratorRequest:
    if not name:
        raise ResourceError("expected an accelerator name like V100 or H100:8", path)
    number: float | None
    try:
        number = float(count) if not isinstance(count, bool) else None
    except (TypeError, ValueError, OverflowError):
        number = None
    if number is None or not number > 0 or number == float("inf"):
        raise ResourceError(f"expected a positive number of {name} per node, got {count!r}", path)
    if number > MAX_GPUS_PER_NODE:
        raise ResourceError(f"expected at most {MAX_GPUS_PER_NODE} {name} per node, got {count!r}", path)
    if not number.is_integer() and number > 1:
        raise ResourceError(f"a fraction of a GPU must be below 1 (a share of one {name}, e.g. {name}:0.5); "
                            f"expected a whole number or a fraction below 1, got {count!r}", path)
    return AcceleratorRequest(name, int(number) if number.is_integer() else number, path)
