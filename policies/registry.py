"""A registry of policies of one kind, by name: ``@SELECTION_POLICIES.register("broker")``.

A policy is a pure function of immutable snapshots (no I/O, no clock, no database), so the
simulator and the live engine can call the very same one. Each kind has its own registry, typed
by that kind's Protocol and kept in the module that defines the kind's request (e.g.
``policies.selection.SELECTION_POLICIES``); ``policies.kinds`` imports every built-in policy and
is where they are looked up and chosen from the settings. A policy registered ``simulator_only``
(one that sees the whole future) is refused for a live engine.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Generic, TypeVar

from policies.errors import PolicyInputError

P = TypeVar("P", bound=Callable[..., object])


class UnknownPolicy(PolicyInputError, KeyError):
    def __str__(self) -> str:
        return str(self.args[0])


def shown(name: str | None) -> str:
    """A name as an error quotes it: shortened, so a huge value is not echoed back whole."""
    return repr(name if name is None or len(name) <= 60 else name[:60] + "...")


class Registry(Generic[P]):
    """The policies of one kind by name, its default, and which of them only the simulator may run."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self._policies: dict[str, P] = {}
        self._default: str | None = None
        self._simulator_only: set[str] = set()

    def register(self, name: str, *, default: bool = False, simulator_only: bool = False) -> Callable[[P], P]:
        def decorate(func: P) -> P:
            self.add(name, func, default=default, simulator_only=simulator_only)
            return func

        return decorate

    def add(self, name: str, func: P, *, default: bool = False, simulator_only: bool = False) -> None:
        if name in self._policies and self._policies[name] is not func:
            raise ValueError(f"{self.kind} policy {name!r} is registered twice")
        self._policies[name] = func
        if default:
            self._default = name
        if simulator_only:
            self._simulator_only.add(name)

    def get(self, name: str | None = None, *, live: bool = False) -> P:
        """The policy ``name`` (None: the default); ``live``: refuse simulator-only ones."""
        name = name or self._default
        if name is None or name not in self._policies:
            raise UnknownPolicy(f"unknown {self.kind} policy {shown(name)}; "
                                f"registered: {', '.join(self.names(live=live)) or 'none'}")
        if live and name in self._simulator_only:
            raise UnknownPolicy(f"the {self.kind} policy {name!r} runs only in `broker simulate`; "
                                f"a live broker can use: {', '.join(self.names(live=True))}")
        return self._policies[name]

    def check(self, name: str | None) -> str | None:
        """``name`` if a live broker may use it; raises ``UnknownPolicy`` (one line) if not."""
        if name is not None:
            self.get(name, live=True)
        return name

    def names(self, live: bool = False) -> list[str]:
        return sorted(n for n in self._policies if not (live and n in self._simulator_only))

    def default_name(self) -> str | None:
        return self._default

    def simulator_only(self, name: str) -> bool:
        return name in self._simulator_only
