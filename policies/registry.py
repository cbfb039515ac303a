"""Policies registered by name, chosen in config: ``@register("selection", "broker")``.

A policy is a pure function of immutable snapshots (no I/O, no clock, no database), so the
simulator and the live engine can call the very same one.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

F = TypeVar("F", bound=Callable[..., Any])

KINDS: tuple[str, ...] = ("selection", "placement", "preemption", "admission", "sharing")

_REGISTRY: dict[str, dict[str, Callable[..., Any]]] = {kind: {} for kind in KINDS}
_DEFAULTS: dict[str, str] = {}


class UnknownPolicy(KeyError):
    def __str__(self) -> str:
        return str(self.args[0])


def register(kind: str, name: str, *, default: bool = False) -> Callable[[F], F]:
    if kind not in _REGISTRY:
        raise ValueError(f"unknown policy kind {kind!r}; expected one of {', '.join(KINDS)}")

    def decorate(func: F) -> F:
        if name in _REGISTRY[kind] and _REGISTRY[kind][name] is not func:
            raise ValueError(f"{kind} policy {name!r} is registered twice")
        _REGISTRY[kind][name] = func
        if default:
            _DEFAULTS[kind] = name
        return func

    return decorate


def _load_builtin() -> None:
    # Importing the policy modules registers them; done lazily to keep import order free.
    import policies.admission
    import policies.placement
    import policies.preemption
    import policies.sharing  # noqa: F401
    from policies import selection  # noqa: F401


def get(kind: str, name: str | None = None) -> Callable[..., Any]:
    _load_builtin()
    name = name or _DEFAULTS.get(kind)
    if kind not in _REGISTRY:
        raise UnknownPolicy(f"unknown policy kind {kind!r}; expected one of {', '.join(KINDS)}")
    if name not in _REGISTRY[kind]:
        raise UnknownPolicy(
            f"unknown {kind} policy {name!r}; registered: {', '.join(sorted(_REGISTRY[kind])) or 'none'}"
        )
    return _REGISTRY[kind][name]


def names(kind: str) -> list[str]:
    _load_builtin()
    return sorted(_REGISTRY.get(kind, {}))


def default_name(kind: str) -> str | None:
    _load_builtin()
    return _DEFAULTS.get(kind)
