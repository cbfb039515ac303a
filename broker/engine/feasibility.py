"""Whether a market could ever hold a job: checked when the job is submitted, never later.

A job no market of these offers can hold (no node of its accelerators at its count per node, or a
gang bigger than ``max_gpus`` on the smallest node that fits) would wait forever with no reason; it
is refused at submission instead, naming the field. Anything the market does offer is accepted,
however scarce: capacity and prices move, and the selection policy decides about them later.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Any

from broker.engine.planning import fits_node
from broker.spec.job import JobSpec, SpecError

# (accelerator, GPUs per node[, instance type]) a market offers; without the type, a choice tied to
# instance types (`instance_type` with `accelerators`) is taken to fit any node of its GPUs.
NodeKind = tuple[Any, ...]


def never_held(spec: JobSpec, offered: Collection[NodeKind] | None, max_gpus: int | None) -> SpecError | None:
    """Why no market offering ``offered`` (None: whatever the job file names) can hold ``spec``; None if one may."""
    smallest = spec.gpus_per_node
    if offered is not None and spec.accelerators:  # a CPU-only task: its node shape is judged when it is read
        kinds = [(str(k[0]), int(k[1]), str(k[2]) if len(k) > 2 and k[2] else None) for k in offered]
        # A choice tied to an instance type fits only nodes of that type, as at placement.
        sizes = [gpus for accelerator, gpus, instance_type in kinds
                 if fits_node(spec, accelerator, gpus, instance_type=instance_type)]
        if not sizes:
            tied = any(a.instance_types for a in spec.accelerators)
            wanted = ", ".join(f"{a.name}:{a.count}" + (f" on {'|'.join(a.instance_types)}" if a.instance_types else "")
                               for a in spec.accelerators) or "a node"
            have = ", ".join(sorted({f"{name}:{gpus}" + (f" ({it})" if tied and it else "")
                                     for name, gpus, it in kinds})) or "nothing"
            return SpecError(f"no zone of the market offers {wanted} per node (the market has {have})",
                             field="resources.accelerators", source=spec.source)
        smallest = min(sizes)  # a node bigger than asked holds the gang too, its other GPUs left to others
    needed = spec.num_nodes * smallest
    if max_gpus is not None and needed > max_gpus:
        return SpecError(f"{spec.num_nodes} node(s) of {smallest} GPUs need {needed} GPUs, more than the broker may "
                         f"hold (max_gpus: {max_gpus})", field="num_nodes", source=spec.source)
    return None
