"""The built-in GPU instance catalog: what each cloud's GPU node types carry.

Used offline (job-file validation without SkyPilot's catalog, Azure prices without credentials)
and as the key the topology model and price pollers share. Figures are the clouds' published
instance specifications (AWS EC2 accelerated-computing instance types, GCP GPU machine types,
Azure GPU-optimized VM sizes); memory is GiB per node, GPU memory GB per GPU.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class InstanceType:
    cloud: str
    name: str
    accelerator: str
    gpus: int
    gpu_memory_gb: float
    vcpus: int
    memory_gb: float
    # GCP n1 takes GPUs attached to a general-purpose machine instead of bundling them.
    attached: bool = False


def _t(cloud: str, name: str, acc: str, gpus: int, gpu_mem: float, vcpus: int, mem: float,
       attached: bool = False) -> InstanceType:
    return InstanceType(cloud, name, acc, gpus, gpu_mem, vcpus, mem, attached)


GPU_INSTANCE_TYPES: tuple[InstanceType, ...] = (
    # AWS: https://aws.amazon.com/ec2/instance-types/ (P3, P4, P5, G5, G6 sections)
    _t("aws", "p3.2xlarge", "V100", 1, 16, 8, 61),
    _t("aws", "p3.8xlarge", "V100", 4, 16, 32, 244),
    _t("aws", "p3.16xlarge", "V100", 8, 16, 64, 488),
    _t("aws", "p3dn.24xlarge", "V100-32GB", 8, 32, 96, 768),
    _t("aws", "p4d.24xlarge", "A100", 8, 40, 96, 1152),
    _t("aws", "p4de.24xlarge", "A100-80GB", 8, 80, 96, 1152),
    _t("aws", "p5.48xlarge", "H100", 8, 80, 192, 2048),
    _t("aws", "g5.xlarge", "A10G", 1, 24, 4, 16),
    _t("aws", "g5.2xlarge", "A10G", 1, 24, 8, 32),
    _t("aws", "g5.4xlarge", "A10G", 1, 24, 16, 64),
    _t("aws", "g5.8xlarge", "A10G", 1, 24, 32, 128),
    _t("aws", "g5.12xlarge", "A10G", 4, 24, 48, 192),
    _t("aws", "g5.24xlarge", "A10G", 4, 24, 96, 384),
    _t("aws", "g5.48xlarge", "A10G", 8, 24, 192, 768),
    _t("aws", "g6.xlarge", "L4", 1, 24, 4, 16),
    _t("aws", "g6.2xlarge", "L4", 1, 24, 8, 32),
    _t("aws", "g6.12xlarge", "L4", 4, 24, 48, 192),
    _t("aws", "g6.24xlarge", "L4", 4, 24, 96, 384),
    _t("aws", "g6.48xlarge", "L4", 8, 24, 192, 768),
    # GCP: https://cloud.google.com/compute/docs/gpus (A3, A2, G2 machine types; N1 + attached GPUs)
    _t("gcp", "a2-highgpu-1g", "A100", 1, 40, 12, 85),
    _t("gcp", "a2-highgpu-2g", "A100", 2, 40, 24, 170),
    _t("gcp", "a2-highgpu-4g", "A100", 4, 40, 48, 340),
    _t("gcp", "a2-highgpu-8g", "A100", 8, 40, 96, 680),
    _t("gcp", "a2-megagpu-16g", "A100", 16, 40, 96, 1360),
    _t("gcp", "a2-ultragpu-1g", "A100-80GB", 1, 80, 12, 170),
    _t("gcp", "a2-ultragpu-8g", "A100-80GB", 8, 80, 96, 1360),
    _t("gcp", "a3-highgpu-8g", "H100", 8, 80, 208, 1872),
    _t("gcp", "g2-standard-4", "L4", 1, 24, 4, 16),
    _t("gcp", "g2-standard-8", "L4", 1, 24, 8, 32),
    _t("gcp", "g2-standard-24", "L4", 2, 24, 24, 96),
    _t("gcp", "g2-standard-48", "L4", 4, 24, 48, 192),
    _t("gcp", "g2-standard-96", "L4", 8, 24, 96, 384),
    _t("gcp", "n1-highmem-8", "V100", 1, 16, 8, 52, attached=True),
    _t("gcp", "n1-highmem-16", "V100", 2, 16, 16, 104, attached=True),
    _t("gcp", "n1-highmem-32", "V100", 4, 16, 32, 208, attached=True),
    _t("gcp", "n1-highmem-64", "V100", 8, 16, 64, 416, attached=True),
    _t("gcp", "n1-standard-8", "T4", 1, 16, 8, 30, attached=True),
    # Azure: https://learn.microsoft.com/azure/virtual-machines/sizes/gpu-accelerated/
    _t("azure", "Standard_NC6s_v3", "V100", 1, 16, 6, 112),
    _t("azure", "Standard_NC12s_v3", "V100", 2, 16, 12, 224),
    _t("azure", "Standard_NC24s_v3", "V100", 4, 16, 24, 448),
    _t("azure", "Standard_NC24ads_A100_v4", "A100-80GB", 1, 80, 24, 220),
    _t("azure", "Standard_NC48ads_A100_v4", "A100-80GB", 2, 80, 48, 440),
    _t("azure", "Standard_NC96ads_A100_v4", "A100-80GB", 4, 80, 96, 880),
    _t("azure", "Standard_ND96asr_v4", "A100", 8, 40, 96, 900),
    _t("azure", "Standard_ND96amsr_A100_v4", "A100-80GB", 8, 80, 96, 1900),
    _t("azure", "Standard_ND96isr_H100_v5", "H100", 8, 80, 96, 1900),
    _t("azure", "Standard_NV36ads_A10_v5", "A10", 1, 24, 36, 440),
)

ACCELERATORS: frozenset[str] = frozenset(t.accelerator for t in GPU_INSTANCE_TYPES)


def instance_types(cloud: str | None = None, accelerator: str | None = None,
                   gpus: int | None = None) -> list[InstanceType]:
    return [
        t
        for t in GPU_INSTANCE_TYPES
        if (cloud is None or t.cloud == cloud)
        and (accelerator is None or t.accelerator.lower() == accelerator.lower())
        and (gpus is None or t.gpus == gpus)
    ]


def find(cloud: str, name: str) -> InstanceType | None:
    """The first catalog entry for ``name`` on ``cloud`` (GCP n1 types have one per GPU option)."""
    for t in GPU_INSTANCE_TYPES:
        if t.cloud == cloud and t.name == name:
            return t
    return None


def canonical_accelerator(name: str) -> str | None:
    """The catalog's spelling of an accelerator name given in any case, or None if unknown."""
    lowered = name.lower()
    for acc in ACCELERATORS:
        if acc.lower() == lowered:
            return acc
    return None


def find_any(name: str, cloud: str | None = None) -> InstanceType | None:
    """``name`` on ``cloud``, or on whichever cloud sells it when ``cloud`` is None (names do not clash)."""
    for t in GPU_INSTANCE_TYPES:
        if t.name == name and (cloud is None or t.cloud == cloud):
            return t
    return None
