"""Policies registered by name, chosen in config: ``@register("selection", "broker")``.

A policy is a pure function of immutable snapshots (no I/O, no clock, no database), so the
simulator and the live engine can call the very same one. Each kind has its own Protocol, so
``get("placement", name)`` is typed as a placement policy. Names are checked where settings are
read (``check``); a policy registered ``simulator_only`` (one that sees the whole future) is
refused for a live engine.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import TYPE_CHECKING, Literal, Protocol, TypeVar, overload

from policies.errors import PolicyInputError

if TYPE_CHECKING:
    from policies.admission import AdmissionRequest
    from policies.checkpointing import CheckpointPlan, CheckpointRequest
    from policies.eager import EagerDecision, EagerRequest
    from policies.gang import GangPlacement
    from policies.placement import ClusterSnapshot, PlacementRequest
    from policies.preemption import PreemptionPlan, PreemptionRequest, RunningGang
    from policies.selection import Plan, SelectionRequest
    from policies.sharing import SharingCluster, SharingPlacement, SharingRequest

Kind = Literal["selection", "placement", "preemption", "admission", "sharing", "checkpointing", "eager"]
KINDS: tuple[Kind, ...] = ("selection", "placement", "preemption", "admission", "sharing", "checkpointing",
                           "eager")
# The modules whose import registers the built-in policies.
BUILTIN = ("policies.selection", "policies.baselines", "policies.broker_policy", "policies.optimal",
           "policies.placement", "policies.preemption", "policies.admission", "policies.sharing",
           "policies.checkpointing", "policies.eager")


class SelectionPolicy(Protocol):
    """Where a job should run, best first."""

    def __call__(self, request: SelectionRequest, /) -> Plan: ...


class PlacementPolicy(Protocol):
    """Which GPUs of a cluster a gang takes; None if it does not fit."""

    def __call__(self, request: PlacementRequest, cluster: ClusterSnapshot, /) -> GangPlacement | None: ...


class PreemptionPolicy(Protocol):
    """Which lower-priority gangs give up their GPUs for a waiting one; None: nobody."""

    def __call__(self, request: PreemptionRequest, cluster: ClusterSnapshot,
                 running: tuple[RunningGang, ...], /) -> PreemptionPlan | None: ...


class AdmissionPolicy(Protocol):
    """Whether a queued job may be planned now."""

    def __call__(self, request: AdmissionRequest, /) -> bool: ...


class SharingPolicy(Protocol):
    """Which node and GPU fractions a task that shares GPUs takes; None if it does not fit."""

    def __call__(self, request: SharingRequest, cluster: SharingCluster, /) -> SharingPlacement | None: ...


class CheckpointingPolicy(Protocol):
    """How often a running job should checkpoint."""

    def __call__(self, request: CheckpointRequest, /) -> CheckpointPlan: ...


class EagerPolicy(Protocol):
    """Whether to ready a queued job now, before a running job's predicted finish."""

    def __call__(self, request: EagerRequest, /) -> EagerDecision: ...


Policy = (SelectionPolicy | PlacementPolicy | PreemptionPolicy | AdmissionPolicy | SharingPolicy
          | CheckpointingPolicy | EagerPolicy)
S = TypeVar("S", bound=SelectionPolicy)
P = TypeVar("P", bound=PlacementPolicy)
X = TypeVar("X", bound=PreemptionPolicy)
A = TypeVar("A", bound=AdmissionPolicy)
H = TypeVar("H", bound=SharingPolicy)
C = TypeVar("C", bound=CheckpointingPolicy)
E = TypeVar("E", bound=EagerPolicy)

_REGISTRY: dict[str, dict[str, Policy]] = {kind: {} for kind in KINDS}
_DEFAULTS: dict[str, str] = {}
_SIMULATOR_ONLY: set[tuple[str, str]] = set()


class UnknownPolicy(PolicyInputError, KeyError):
    def __str__(self) -> str:
        return str(self.args[0])


@overload
def register(kind: Literal["selection"], name: str, *, default: bool = False,
             simulator_only: bool = False) -> Callable[[S], S]: ...
@overload
def register(kind: Literal["placement"], name: str, *, default: bool = False,
             simulator_only: bool = False) -> Callable[[P], P]: ...
@overload
def register(kind: Literal["preemption"], name: str, *, default: bool = False,
             simulator_only: bool = False) -> Callable[[X], X]: ...
@overload
def register(kind: Literal["admission"], name: str, *, default: bool = False,
             simulator_only: bool = False) -> Callable[[A], A]: ...
@overload
def register(kind: Literal["sharing"], name: str, *, default: bool = False,
             simulator_only: bool = False) -> Callable[[H], H]: ...
@overload
def register(kind: Literal["checkpointing"], name: str, *, default: bool = False,
             simulator_only: bool = False) -> Callable[[C], C]: ...
@overload
def register(kind: Literal["eager"], name: str, *, default: bool = False,
             simulator_only: bool = False) -> Callable[[E], E]: ...
def register(kind: Kind, name: str, *, default: bool = False,  # type: ignore[misc]
             simulator_only: bool = False) -> Callable[[Policy], Policy]:
    if kind not in _REGISTRY:
        raise ValueError(f"unknown policy kind {kind!r}; expected one of {', '.join(KINDS)}")

    def decorate(func: Policy) -> Policy:
        if name in _REGISTRY[kind] and _REGISTRY[kind][name] is not func:
            raise ValueError(f"{kind} policy {name!r} is registered twice")
        _REGISTRY[kind][name] = func
        if default:
            _DEFAULTS[kind] = name
        if simulator_only:
            _SIMULATOR_ONLY.add((kind, name))
        return func

    return decorate


def _shown(name: str | None) -> str:
    """A name as an error quotes it: shortened, so a huge value is not echoed back whole."""
    return repr(name if name is None or len(name) <= 60 else name[:60] + "...")


def _load_builtin() -> None:
    # Importing the policy modules registers them; done lazily to keep import order free.
    for module in BUILTIN:
        importlib.import_module(module)


def _find(kind: str, name: str | None, live: bool = False) -> Policy:
    _load_builtin()
    if kind not in _REGISTRY:
        raise UnknownPolicy(f"unknown policy kind {kind!r}; expected one of {', '.join(KINDS)}")
    name = name or _DEFAULTS.get(kind)
    if name not in _REGISTRY[kind]:
        raise UnknownPolicy(
            f"unknown {kind} policy {_shown(name)}; registered: {', '.join(names(kind, live=live)) or 'none'}"
        )
    if live and (kind, name) in _SIMULATOR_ONLY:
        raise UnknownPolicy(f"the {kind} policy {name!r} runs only in `broker simulate`; "
                            f"a live broker can use: {', '.join(names(kind, live=True))}")
    return _REGISTRY[kind][name]


@overload
def get(kind: Literal["selection"], name: str | None = None, *, live: bool = False) -> SelectionPolicy: ...
@overload
def get(kind: Literal["placement"], name: str | None = None, *, live: bool = False) -> PlacementPolicy: ...
@overload
def get(kind: Literal["preemption"], name: str | None = None, *, live: bool = False) -> PreemptionPolicy: ...
@overload
def get(kind: Literal["admission"], name: str | None = None, *, live: bool = False) -> AdmissionPolicy: ...
@overload
def get(kind: Literal["sharing"], name: str | None = None, *, live: bool = False) -> SharingPolicy: ...
@overload
def get(kind: Literal["checkpointing"], name: str | None = None, *, live: bool = False) -> CheckpointingPolicy: ...
@overload
def get(kind: Literal["eager"], name: str | None = None, *, live: bool = False) -> EagerPolicy: ...
def get(kind: Kind, name: str | None = None, *, live: bool = False) -> Policy:
    """The policy ``name`` of ``kind`` (None: the kind's default); ``live``: refuse simulator-only ones."""
    return _find(kind, name, live)


def check(kind: str, name: str | None) -> str | None:
    """``name`` if a live broker may use it as its ``kind`` policy; raises ``UnknownPolicy`` (one line) if not."""
    if name is not None:
        _find(kind, name, live=True)
    return name


def names(kind: str, live: bool = False) -> list[str]:
    _load_builtin()
    return sorted(n for n in _REGISTRY.get(kind, {}) if not (live and (kind, n) in _SIMULATOR_ONLY))


def default_name(kind: str) -> str | None:
    _load_builtin()
    return _DEFAULTS.get(kind)


def simulator_only(kind: str, name: str) -> bool:
    _load_builtin()
    return (kind, name) in _SIMULATOR_ONLY
