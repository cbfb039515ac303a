"""Every kind of policy, each with its typed registry, and the one place policies are chosen.

Importing this module imports every built-in policy module, which registers its policies; look
policies up here (``kinds.selection.get("broker")``), not in the kind's own module, so that all
of them are registered. ``choose`` picks one policy of each kind from the settings' names.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import ModuleType
from typing import Any

import policies.baselines
import policies.broker_policy
import policies.fair_share_baselines
import policies.optimal
import policies.sharing
from policies.admission import ADMISSION_POLICIES, AdmissionPolicy
from policies.checkpointing import CHECKPOINTING_POLICIES, CheckpointingPolicy
from policies.eager import EAGER_POLICIES, EagerPolicy
from policies.fair_share import FAIR_SHARE_POLICIES, FairSharePolicy
from policies.placement import PLACEMENT_POLICIES, PlacementPolicy
from policies.preemption import PREEMPTION_POLICIES, PreemptionPolicy
from policies.registry import Registry, UnknownPolicy
from policies.selection import SELECTION_POLICIES, SelectionPolicy
from policies.sharing_model import SHARING_POLICIES, SharingPolicy

# Modules that register policies into a kind defined in another module (each kind's own module is
# imported above for its registry).
REGISTERING: tuple[ModuleType, ...] = (policies.baselines, policies.broker_policy, policies.fair_share_baselines,
                                       policies.optimal, policies.sharing)

selection = SELECTION_POLICIES
placement = PLACEMENT_POLICIES
preemption = PREEMPTION_POLICIES
admission = ADMISSION_POLICIES
sharing = SHARING_POLICIES
checkpointing = CHECKPOINTING_POLICIES
eager = EAGER_POLICIES
fair_share = FAIR_SHARE_POLICIES

BY_KIND: dict[str, Registry[Any]] = {r.kind: r for r in (
    selection, placement, preemption, admission, sharing, checkpointing, eager, fair_share)}
KINDS: tuple[str, ...] = tuple(BY_KIND)


def of(kind: str) -> Registry[Any]:
    """The registry of ``kind``; ``UnknownPolicy`` (one line) for a kind there is none of."""
    if kind not in BY_KIND:
        raise UnknownPolicy(f"unknown policy kind {kind!r}; expected one of {', '.join(KINDS)}")
    return BY_KIND[kind]


@dataclass(frozen=True)
class Chosen:
    """One policy of each kind, as a live broker runs them."""

    selection: SelectionPolicy
    placement: PlacementPolicy
    preemption: PreemptionPolicy
    admission: AdmissionPolicy
    sharing: SharingPolicy
    checkpointing: CheckpointingPolicy
    eager: EagerPolicy
    eager_name: str
    fair_share: FairSharePolicy


def choose(*, selection_name: str | None = None, placement_name: str | None = None,
           preemption_name: str | None = None, admission_name: str | None = None,
           sharing_name: str | None = None, checkpointing_name: str | None = None,
           eager_name: str | None = None, fair_share_name: str | None = None) -> Chosen:
    """The policies a live broker runs, by the names in its settings (None: the kind's default)."""
    return Chosen(
        selection=selection.get(selection_name, live=True),
        placement=placement.get(placement_name, live=True),
        preemption=preemption.get(preemption_name, live=True),
        admission=admission.get(admission_name, live=True),
        sharing=sharing.get(sharing_name, live=True),
        checkpointing=checkpointing.get(checkpointing_name, live=True),
        eager=eager.get(eager_name, live=True),
        eager_name=eager_name or eager.default_name() or "off",
        fair_share=fair_share.get(fair_share_name, live=True),
    )
