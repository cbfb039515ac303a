"""How the GPUs of each instance type talk: inside a node, between nodes, and where nodes can sit.

A ``NodeTopology`` holds, for one GPU instance type:

- ``link_kind[i][j]`` / ``link_gb_s[i][j]``: the path between GPU i and GPU j and its bandwidth in
  GB/s per direction (``nvswitch``: every pair at the GPU's full NVLink rate; ``nvlink``: direct
  NVLink, the bandwidth counting bonded links; ``pcie``: through the PCIe fabric, possibly the CPU);
- ``network_gbit_s`` / ``network_kind``: the node's network for inter-node traffic (EFA,
  InfiniBand or plain ethernet), Gbit/s;
- ``placement_level``: how the cloud lets a cluster's nodes sit close together (None if it does not).

Link bandwidths used throughout (per direction):
- NVLink 2.0 (V100): 25 GB/s per link, 6 links per GPU (NVIDIA Tesla V100 GPU architecture
  whitepaper, 2017, "NVLink": 300 GB/s total bidirectional).
- NVLink 3.0 via NVSwitch (A100 SXM): 300 GB/s per GPU (NVIDIA A100 Tensor Core GPU architecture
  whitepaper, 2020: 600 GB/s total bidirectional).
- NVLink 4.0 via NVSwitch (H100 SXM): 450 GB/s per GPU (NVIDIA H100 Tensor Core GPU architecture
  whitepaper, 2022: 900 GB/s total bidirectional).
- PCIe 3.0 x16: 15.75 GB/s; PCIe 4.0 x16: 31.5 GB/s (PCI-SIG base specifications 3.0 and 4.0:
  8 and 16 GT/s per lane, 128b/130b encoding). GPU pairs without NVLink go through this fabric.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from functools import lru_cache

from providers.base import ProviderInputError

NVSWITCH = "nvswitch"
NVLINK = "nvlink"
PCIE = "pcie"

NVLINK2_LINK_GB_S = 25.0
NVLINK3_NVSWITCH_GB_S = 300.0
NVLINK4_NVSWITCH_GB_S = 450.0
PCIE3_X16_GB_S = 15.75
PCIE4_X16_GB_S = 31.5

# Where a cloud lets nodes sit close (its own name for it).
AWS_PLACEMENT = "cluster placement group"  # EC2 docs, "Placement groups", strategy=cluster
GCP_PLACEMENT = "compact placement policy"  # Compute Engine docs, "Placement policies", COLLOCATED
AZURE_PLACEMENT = "proximity placement group"  # Azure docs, "Proximity placement groups"


class UnknownInstanceType(ProviderInputError, KeyError):
    def __str__(self) -> str:
        return str(self.args[0])


@dataclass(frozen=True, slots=True)
class NodeTopology:
    cloud: str
    instance_type: str
    gpus: int
    link_kind: tuple[tuple[str, ...], ...]
    link_gb_s: tuple[tuple[float, ...], ...]
    network_gbit_s: float
    network_kind: str  # efa | infiniband | ethernet
    placement_level: str | None

    @property
    def network_gb_s(self) -> float:
        return self.network_gbit_s / 8.0

    @property
    def uniform(self) -> bool:
        """True when every GPU pair has the same link: any k GPUs of a node are as good as any other k."""
        values = {self.link_gb_s[i][j] for i in range(self.gpus) for j in range(self.gpus) if i != j}
        return len(values) <= 1

    def link(self, i: int, j: int) -> tuple[str, float]:
        return self.link_kind[i][j], self.link_gb_s[i][j]


def _matrix(n: int, kind: str, gb_s: float) -> tuple[tuple[tuple[str, ...], ...], tuple[tuple[float, ...], ...]]:
    kinds = tuple(tuple("" if i == j else kind for j in range(n)) for i in range(n))
    bws = tuple(tuple(0.0 if i == j else gb_s for j in range(n)) for i in range(n))
    return kinds, bws


# NVIDIA DGX-1 with V100 (= AWS p3.16xlarge / p3dn.24xlarge): hybrid cube-mesh. Bonded NVLink
# count per pair as `nvidia-smi topo -m` prints it on these nodes (NV1 / NV2); pairs absent here have
# no NVLink and go over PCIe and the CPU interconnect ("SYS"). Source: NVIDIA DGX-1 with Tesla V100
# system architecture whitepaper (2017), figure "DGX-1 uses an 8-GPU hybrid cube-mesh interconnect";
# every GPU uses all six of its links: e.g. GPU 0 = 1+1 (GPUs 1, 2) + 2+2 (GPUs 3, 4); GPU 0 and 6
# share none.
DGX1_NVLINKS: dict[tuple[int, int], int] = {
    (0, 1): 1, (0, 2): 1, (0, 3): 2, (0, 4): 2,
    (1, 2): 2, (1, 3): 1, (1, 5): 2,
    (2, 3): 2, (2, 6): 1,
    (3, 7): 1,
    (4, 5): 1, (4, 6): 1, (4, 7): 2,
    (5, 6): 2, (5, 7): 1,
    (6, 7): 2,
}


def _dgx1(n: int) -> tuple[tuple[tuple[str, ...], ...], tuple[tuple[float, ...], ...]]:
    """The first ``n`` GPUs of the DGX-1 mesh (p3.8xlarge is one half: GPUs 0-3, fully NVLinked)."""
    kinds = [["" if i == j else PCIE for j in range(n)] for i in range(n)]
    bws = [[0.0 if i == j else PCIE3_X16_GB_S for j in range(n)] for i in range(n)]
    for (a, b), links in DGX1_NVLINKS.items():
        if a < n and b < n:
            kinds[a][b] = kinds[b][a] = NVLINK
            bws[a][b] = bws[b][a] = links * NVLINK2_LINK_GB_S
    return tuple(tuple(r) for r in kinds), tuple(tuple(r) for r in bws)


def _node(cloud: str, name: str, gpus: int, intra: str, network_gbit_s: float, network_kind: str,
          placement: str | None) -> NodeTopology:
    if intra == "dgx1":
        kinds, bws = _dgx1(gpus)
    elif intra == "a100-nvswitch":
        kinds, bws = _matrix(gpus, NVSWITCH, NVLINK3_NVSWITCH_GB_S)
    elif intra == "h100-nvswitch":
        kinds, bws = _matrix(gpus, NVSWITCH, NVLINK4_NVSWITCH_GB_S)
    elif intra == "pcie4":
        kinds, bws = _matrix(gpus, PCIE, PCIE4_X16_GB_S)
    else:
        raise ValueError(f"unknown intra-node topology {intra!r}")
    return NodeTopology(cloud, name, gpus, kinds, bws, network_gbit_s, network_kind, placement)


_A = AWS_PLACEMENT
_G = GCP_PLACEMENT
_Z = AZURE_PLACEMENT

TOPOLOGIES: tuple[NodeTopology, ...] = (
    # AWS network figures: https://aws.amazon.com/ec2/instance-types/ (P3, P4, P5, G5, G6 tables,
    # "Network Bandwidth (Gbps)"; "up to N" taken as N). EFA where the table lists it.
    _node("aws", "p3.2xlarge", 1, "dgx1", 10, "ethernet", _A),
    _node("aws", "p3.8xlarge", 4, "dgx1", 10, "ethernet", _A),
    _node("aws", "p3.16xlarge", 8, "dgx1", 25, "ethernet", _A),
    _node("aws", "p3dn.24xlarge", 8, "dgx1", 100, "efa", _A),
    _node("aws", "p4d.24xlarge", 8, "a100-nvswitch", 400, "efa", _A),
    _node("aws", "p4de.24xlarge", 8, "a100-nvswitch", 400, "efa", _A),
    _node("aws", "p5.48xlarge", 8, "h100-nvswitch", 3200, "efa", _A),
    # G5 (A10G) and G6 (L4) have no NVLink: GPUs talk over PCIe 4.0 (AWS G5/G6 product pages;
    # NVIDIA A10 and L4 datasheets list PCIe Gen4 x16 and no NVLink). AWS does not publish the PCIe
    # switch layout, so every pair is modelled alike.
    _node("aws", "g5.xlarge", 1, "pcie4", 10, "ethernet", _A),
    _node("aws", "g5.2xlarge", 1, "pcie4", 10, "ethernet", _A),
    _node("aws", "g5.4xlarge", 1, "pcie4", 25, "ethernet", _A),
    _node("aws", "g5.8xlarge", 1, "pcie4", 25, "efa", _A),
    _node("aws", "g5.12xlarge", 4, "pcie4", 40, "efa", _A),
    _node("aws", "g5.24xlarge", 4, "pcie4", 50, "efa", _A),
    _node("aws", "g5.48xlarge", 8, "pcie4", 100, "efa", _A),
    _node("aws", "g6.xlarge", 1, "pcie4", 10, "ethernet", _A),
    _node("aws", "g6.2xlarge", 1, "pcie4", 10, "ethernet", _A),
    _node("aws", "g6.12xlarge", 4, "pcie4", 40, "ethernet", _A),
    _node("aws", "g6.24xlarge", 4, "pcie4", 50, "ethernet", _A),
    _node("aws", "g6.48xlarge", 8, "pcie4", 100, "ethernet", _A),
    # GCP: https://cloud.google.com/compute/docs/gpus#a100-gpus, #h100-gpus, #l4-gpus (machine type
    # tables, "Maximum network bandwidth (Gbps)"). A2/A3 GPUs sit on NVSwitch (HGX boards; the
    # 16-GPU a2-megagpu joins two boards all-to-all); G2's L4s have no NVLink.
    _node("gcp", "a2-highgpu-1g", 1, "a100-nvswitch", 24, "ethernet", _G),
    _node("gcp", "a2-highgpu-2g", 2, "a100-nvswitch", 32, "ethernet", _G),
    _node("gcp", "a2-highgpu-4g", 4, "a100-nvswitch", 50, "ethernet", _G),
    _node("gcp", "a2-highgpu-8g", 8, "a100-nvswitch", 100, "ethernet", _G),
    _node("gcp", "a2-megagpu-16g", 16, "a100-nvswitch", 100, "ethernet", _G),
    _node("gcp", "a2-ultragpu-1g", 1, "a100-nvswitch", 24, "ethernet", _G),
    _node("gcp", "a2-ultragpu-8g", 8, "a100-nvswitch", 100, "ethernet", _G),
    _node("gcp", "a3-highgpu-8g", 8, "h100-nvswitch", 1000, "ethernet", _G),
    _node("gcp", "g2-standard-4", 1, "pcie4", 10, "ethernet", _G),
    _node("gcp", "g2-standard-8", 1, "pcie4", 16, "ethernet", _G),
    _node("gcp", "g2-standard-24", 2, "pcie4", 32, "ethernet", _G),
    _node("gcp", "g2-standard-48", 4, "pcie4", 50, "ethernet", _G),
    _node("gcp", "g2-standard-96", 8, "pcie4", 100, "ethernet", _G),
    # Azure: https://learn.microsoft.com/azure/virtual-machines/sizes/gpu-accelerated/ (ND A100 v4:
    # 8 x 200 Gb/s HDR InfiniBand per VM; ND H100 v5: 8 x 400 Gb/s NDR InfiniBand per VM; NC A100 v4:
    # A100 PCIe cards, 20/40/80 Gbps ethernet). InfiniBand needs the VMs in one scale set or
    # availability set, which a proximity placement group pins to one datacenter.
    _node("azure", "Standard_ND96asr_v4", 8, "a100-nvswitch", 1600, "infiniband", _Z),
    _node("azure", "Standard_ND96amsr_A100_v4", 8, "a100-nvswitch", 1600, "infiniband", _Z),
    _node("azure", "Standard_ND96isr_H100_v5", 8, "h100-nvswitch", 3200, "infiniband", _Z),
    _node("azure", "Standard_NC24ads_A100_v4", 1, "pcie4", 20, "ethernet", _Z),
    _node("azure", "Standard_NC48ads_A100_v4", 2, "pcie4", 40, "ethernet", _Z),
    _node("azure", "Standard_NC96ads_A100_v4", 4, "pcie4", 80, "ethernet", _Z),
)

_BY_NAME: dict[str, NodeTopology] = {t.instance_type: t for t in TOPOLOGIES}


def generic_topology(cloud: str, instance_type: str, gpus: int) -> NodeTopology:
    """A node we have no measured map for: every GPU pair over PCIe 4.0, the conservative guess."""
    return _node(cloud, instance_type, gpus, "pcie4", 10, "ethernet", None)


def topology(instance_type: str) -> NodeTopology:
    """The topology of ``instance_type`` (names are unique across clouds)."""
    try:
        return _BY_NAME[instance_type]
    except KeyError:
        raise UnknownInstanceType(
            f"no GPU topology for instance type {instance_type!r}; known: {', '.join(sorted(_BY_NAME))}"
        ) from None


def instance_types() -> list[str]:
    return sorted(_BY_NAME)


def ring_bandwidth_gb_s(topo: NodeTopology, gpus: Iterable[int]) -> float:
    """The slowest link of the best ring through ``gpus`` on one node (inf for fewer than 2 GPUs).

    A ring all-reduce runs at the pace of its slowest hop, so the best ring is the Hamiltonian
    cycle whose weakest link is strongest.
    """
    members = sorted(set(gpus))
    mask = 0
    for g in members:
        mask |= 1 << g
    return ring_table(topo)[mask] if topo.gpus <= 8 else _ring_uniform_or_greedy(topo, members)


def _ring_uniform_or_greedy(topo: NodeTopology, members: list[int]) -> float:
    if len(members) < 2:
        return math.inf
    return min(topo.link_gb_s[a][b] for a in members for b in members if a != b)


@lru_cache(maxsize=64)
def ring_table(topo: NodeTopology) -> tuple[float, ...]:
    """Best-ring bottleneck for every subset of a node's GPUs, by bitmask (nodes of up to 8 GPUs).

    Max-min path DP: for each start vertex s (the subset's lowest GPU), best[S][v] is the strongest
    weakest link over paths from s through exactly S ending at v.
    """
    n = topo.gpus
    bw = topo.link_gb_s
    size = 1 << n
    ring = [math.inf] * size
    for s in range(n):
        best: dict[tuple[int, int], float] = {(1 << s, s): math.inf}
        # Only subsets whose lowest member is s, visited in increasing order so paths grow.
        for mask in range(1 << s, size):
            if mask & ((1 << s) - 1) or not mask >> s & 1:
                continue
            for v in range(s, n):
                cur = best.get((mask, v))
                if cur is None:
                    continue
                for u in range(s + 1, n):
                    if mask >> u & 1 or bw[v][u] <= 0:
                        continue
                    key = (mask | 1 << u, u)
                    val = min(cur, bw[v][u])
                    if val > best.get(key, -1.0):
                        best[key] = val
            count = mask.bit_count()
            if count == 2:
                other = (mask & ~(1 << s)).bit_length() - 1
                ring[mask] = bw[s][other]
            elif count > 2:
                closing = [min(best[(mask, v)], bw[v][s]) for v in range(s + 1, n)
                           if (mask, v) in best and bw[v][s] > 0]
                ring[mask] = max(closing) if closing else 0.0
    return tuple(ring)
