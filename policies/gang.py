"""Where a gang runs: the GPUs it holds on a cluster, shared by the policies, the engine and the provisioners."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class GangPlacement:
    """The GPUs a gang holds on a cluster: for every node rank, the GPU indices it uses."""

    cluster_id: str
    gpus: tuple[tuple[int, tuple[int, ...]], ...]  # ((node_rank, (gpu, ...)), ...)

    @property
    def nodes(self) -> tuple[int, ...]:
        return tuple(rank for rank, _ in self.gpus)

    @property
    def gpu_count(self) -> int:
        return sum(len(g) for _, g in self.gpus)

    def visible_devices(self, node_rank: int) -> str:
        for rank, gpus in self.gpus:
            if rank == node_rank:
                return ",".join(str(g) for g in gpus)
        return ""

    @classmethod
    def whole_nodes(cls, cluster_id: str, num_nodes: int, gpus_per_node: int) -> GangPlacement:
        return cls(cluster_id, tuple((r, tuple(range(gpus_per_node))) for r in range(num_nodes)))

    def to_json(self) -> dict[str, list[int]]:
        return {str(rank): list(gpus) for rank, gpus in self.gpus}

    @classmethod
    def from_json(cls, cluster_id: str, data: dict[str, list[int]]) -> GangPlacement:
        return cls(cluster_id, tuple(sorted((int(k), tuple(v)) for k, v in data.items())))
