"""The topology model: every GPU type the issue names is covered, and the DGX-1 mesh is the real one."""

from __future__ import annotations

import math

import pytest

from providers import catalog
from providers.topology import (
    NVLINK,
    NVSWITCH,
    PCIE,
    TOPOLOGIES,
    UnknownInstanceType,
    ring_bandwidth_gb_s,
    topology,
)

ISSUE_TYPES = [
    "p3.16xlarge", "p4d.24xlarge", "p4de.24xlarge", "p5.48xlarge", "g5.48xlarge", "g6.48xlarge",
    "a2-highgpu-8g", "a3-highgpu-8g", "g2-standard-96",
    "Standard_ND96asr_v4", "Standard_ND96isr_H100_v5", "Standard_NC96ads_A100_v4",
]


@pytest.mark.parametrize("name", ISSUE_TYPES)
def test_every_named_family_has_a_topology_matching_the_catalog(name: str) -> None:
    topo = topology(name)
    entry = catalog.find(topo.cloud, name)
    assert entry is not None and entry.gpus == topo.gpus
    assert topo.network_gbit_s > 0 and topo.placement_level


def test_every_topology_matches_its_catalog_entry_and_is_symmetric() -> None:
    for topo in TOPOLOGIES:
        entry = catalog.find(topo.cloud, topo.instance_type)
        assert entry is not None, topo.instance_type
        assert entry.gpus == topo.gpus
        for i in range(topo.gpus):
            for j in range(topo.gpus):
                assert topo.link(i, j) == topo.link(j, i)
                assert (topo.link_gb_s[i][j] > 0) == (i != j)


def test_p3_16xlarge_is_the_dgx1_hybrid_cube_mesh() -> None:
    topo = topology("p3.16xlarge")
    # Each V100 uses all six NVLinks (25 GB/s each): bonded-link bandwidth per GPU sums to 150.
    for i in range(8):
        nv = sum(topo.link_gb_s[i][j] for j in range(8) if topo.link_kind[i][j] == NVLINK)
        assert nv == 150.0
    assert topo.link(0, 6) == (PCIE, 15.75)  # no NVLink between GPU 0 and GPU 6
    assert topo.link(0, 3) == (NVLINK, 50.0)  # two bonded links
    assert topo.link(0, 1) == (NVLINK, 25.0)
    assert not topo.uniform


def test_ring_bottlenecks_on_the_dgx1_mesh() -> None:
    topo = topology("p3.16xlarge")
    assert ring_bandwidth_gb_s(topo, range(8)) == 50.0  # 0-3-2-1-5-6-7-4-0 uses only double links
    assert ring_bandwidth_gb_s(topo, [0, 1, 2, 3]) == 25.0
    assert ring_bandwidth_gb_s(topo, [0, 6]) == 15.75
    assert ring_bandwidth_gb_s(topo, [0, 5, 6]) == 15.75
    assert ring_bandwidth_gb_s(topo, [3]) == math.inf


def test_nvswitch_and_pcie_nodes_are_uniform() -> None:
    assert topology("p4d.24xlarge").uniform and topology("p4d.24xlarge").link(2, 7) == (NVSWITCH, 300.0)
    assert topology("p5.48xlarge").link(0, 7) == (NVSWITCH, 450.0)
    assert topology("g5.48xlarge").link(0, 7) == (PCIE, 31.5)
    assert ring_bandwidth_gb_s(topology("a2-megagpu-16g"), range(16)) == 300.0


def test_unknown_instance_type_names_it() -> None:
    with pytest.raises(UnknownInstanceType, match=r"p9\.mega"):
        topology("p9.mega")
