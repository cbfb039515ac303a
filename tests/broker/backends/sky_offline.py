"""An offline SkyPilot: a runtime directory with small hand-written catalogs and three enabled clouds.

``write_sandbox(root)`` lays out what SkyPilot 0.14 reads under ``$SKY_RUNTIME_DIR/.sky``:
``catalogs/v8/<cloud>/vms.csv`` and ``images.csv`` in the columns the published catalogs use,
AWS's zone-id mapping, the common accelerator list, and a config allowing only aws, gcp and
azure. None of the files has a ``.meta/*.md5`` beside it, which SkyPilot reads as "edited by
hand" and never re-downloads. ``sandbox_env(root)`` is the environment a child process needs:
SkyPilot's state is global to a process, so tests use it only in children.

Run as a script inside that environment (``python -m tests.broker.backends.sky_offline``), it
marks the clouds enabled in SkyPilot's state and seeds the AMI facts SkyPilot would otherwise
ask EC2 for, then renders the SkyPilot task and cluster config for each case on stdin.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

CATALOG_VERSION = "v8"
HEADER = "InstanceType,AcceleratorName,AcceleratorCount,vCPUs,MemoryGiB,GpuInfo,Price,SpotPrice,Region,AvailabilityZone"
AWS_AMIS = {"skypilot:custom-gpu-ubuntu-cuda13": "ami-0a1b2c3d4e5f60718",
            "skypilot:custom-gpu-ubuntu": "ami-0a1b2c3d4e5f60719",
            "skypilot:custom-cpu-ubuntu": "ami-0a1b2c3d4e5f6071a"}


def _gpu_info(name: str, count: int, mib: int) -> str:
    return (f"\"{{'Gpus': [{{'Name': '{name}', 'Manufacturer': 'NVIDIA', 'Count': {count}, "
            f"'MemoryInfo': {{'SizeInMiB': {mib}}}}}], 'TotalGpuMemoryInMiB': {mib * count}}}\"")


def write_sandbox(root: Path) -> None:
    catalogs = root / ".sky" / "catalogs" / CATALOG_VERSION
    for cloud in ("aws", "gcp", "azure", "common"):
        (catalogs / cloud).mkdir(parents=True, exist_ok=True)
    # AWS publishes zone ids (use1-az1); the per-account mapping to names comes from az_mappings.
    aws = [HEADER]
    for zone_id, spot in (("use1-az1", 3.67), ("use1-az2", 2.91), ("usw2-az2", 3.12)):
        region = "us-east-1" if zone_id.startswith("use1") else "us-west-2"
        aws.append(f"p3.8xlarge,V100,4,32,244,{_gpu_info('V100', 4, 16384)},12.24,{spot},{region},{zone_id}")
        aws.append(f"m6i.2xlarge,,,8,32,,0.384,0.151,{region},{zone_id}")
    (catalogs / "aws" / "vms.csv").write_text("\n".join(aws) + "\n")
    (catalogs / "aws" / "az_mappings-default.csv").write_text(
        "AvailabilityZone,AvailabilityZoneName\nuse1-az1,us-east-1a\nuse1-az2,us-east-1b\nusw2-az2,us-west-2b\n")
    images = ["Tag,Region,OS,OSVersion,ImageId,CreationDate"]
    images += [f"{tag},{region},ubuntu,22.04,{ami},20250101"
               for tag, ami in AWS_AMIS.items() for region in ("us-east-1", "us-west-2")]
    (catalogs / "aws" / "images.csv").write_text("\n".join(images) + "\n")
    (catalogs / "aws" / "instance_quota_mapping.csv").write_text("InstanceType,OnDemandInstanceCode,SpotInstanceCode\n")
    # GCP lists a2 hosts and their A100s as separate rows; SkyPilot pairs them.
    gcp = [HEADER]
    for zone, spot in (("us-central1-a", 8.82), ("us-central1-b", 8.10)):
        gcp.append(f"a2-highgpu-8g,,,96,680,,29.39,{spot},us-central1,{zone}")
        gcp.append(f",A100,8,,,{_gpu_info('A100', 8, 40960)},0.0,0.0,us-central1,{zone}")
        gcp.append(f"n2-standard-8,,,8,32,,0.388,0.094,us-central1,{zone}")
    (catalogs / "gcp" / "vms.csv").write_text("\n".join(gcp) + "\n")
    (catalogs / "gcp" / "images.csv").write_text(
        "Tag,Region,OS,OSVersion,ImageId,CreationDate\n"
        "skypilot:custom-gpu-ubuntu-2204-cuda13,,ubuntu,22.04,"
        "projects/sky-dev-465/global/images/skypilot-gcp-gpu-ubuntu-cuda13,20250101\n"
        "skypilot:custom-cpu-ubuntu-2204,,ubuntu,22.04,projects/sky-dev-465/global/images/skypilot-gcp-cpu-ubuntu,"
        "20250101\n")
    (catalogs / "gcp" / "accelerator_quota_mapping.csv").write_text(
        "Accelerator,OnDemandInstanceCode,SpotInstanceCode\n")
    # Azure's catalog has no zones, and a Generation column instead.
    (catalogs / "azure" / "vms.csv").write_text(
        "InstanceType,AcceleratorName,AcceleratorCount,vCPUs,MemoryGiB,GpuInfo,Price,SpotPrice,Region,Generation\n"
        f"Standard_NC24ads_A100_v4,A100-80GB,1,24,220,{_gpu_info('A100-80GB', 1, 81920)},3.673,0.7346,eastus,V2\n"
        "Standard_D8s_v5,,,8,32,,0.384,0.0768,eastus,V1 V2\n")
    (catalogs / "azure" / "images.csv").write_text(
        "Tag,Region,OS,OSVersion,ImageId,CreationDate\n"
        "skypilot:custom-gpu-ubuntu-v2,,ubuntu,22.04,microsoft-dsvm:ubuntu-hpc:2204:latest,20250101\n"
        "skypilot:custom-cpu-ubuntu-v2,,ubuntu,22.04,canonical:0001-com-ubuntu-server-jammy:22_04-lts-gen2:latest,"
        "20250101\n")
    (catalogs / "common" / "accelerators.csv").write_text(
        "AcceleratorName,Clouds\nV100,\"['AWS', 'GCP']\"\nA100,\"['AWS', 'GCP', 'Azure']\"\n"
        "A100-80GB,\"['AWS', 'GCP', 'Azure']\"\n")
    (catalogs / "common" / "metadata.csv").write_text("GPU,MemoryGB,Manufacturer\nV100,16,NVIDIA\nA100,40,NVIDIA\n"
                                                       "A100-80GB,80,NVIDIA\n")
    (root / ".sky" / "config.yaml").write_text("allowed_clouds:\n  - aws\n  - gcp\n  - azure\n")


def sandbox_env(root: Path, repo: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("AWS_", "GOOGLE_", "AZURE_", "SKYPILOT_", "SKY_", "BROKER_"))}
    env.update(HOME=str(root), SKY_RUNTIME_DIR=str(root), PYTHONPATH=str(repo), AWS_EC2_METADATA_DISABLED="true",
               SKYPILOT_DISABLE_USAGE_COLLECTION="1", NO_PROXY="127.0.0.1,localhost", no_proxy="127.0.0.1,localhost",
               BROKER_HOME=str(root / "broker-home"))
    return env


def enable_clouds() -> None:
    """Mark aws, gcp and azure enabled in SkyPilot's state, as a successful ``sky check`` would."""
    import time

    from sky import check, global_user_state
    from sky.clouds import cloud as cloud_lib
    from sky.utils.db import kv_cache

    for capability in (cloud_lib.CloudCapability.COMPUTE, cloud_lib.CloudCapability.STORAGE):
        global_user_state.set_enabled_clouds(["AWS", "GCP", "Azure"], capability, "default")
    global_user_state.set_allowed_clouds(check._get_workspace_allowed_clouds("default"), "default")
    for ami in AWS_AMIS.values():
        for region in ("us-east-1", "us-west-2"):
            kv_cache.add_or_update_cache_entry(f"aws:ami:size:None:{region}:{ami}", "75", time.time() + 86400)
            kv_cache.add_or_update_cache_entry(f"aws:ami:root_device_name:None:{region}:{ami}", "/dev/sda1",
                                               time.time() + 86400)


def render(case: dict[str, Any]) -> dict[str, Any]:
    """SkyPilot's task and dry-run cluster config for one cluster of a job file."""
    import sky
    import yaml
    from sky import execution

    from broker.backends.base import ClusterInfo
    from broker.backends.skypilot.task import AgentPackage, cluster_task, sky_cluster_name
    from broker.spec.job import parse_job_spec

    spec = parse_job_spec(case["job"], source=case["source"])
    cluster = ClusterInfo(**case["cluster"])
    agent = AgentPackage(Path(case["wheel"]))
    name = sky_cluster_name("broker-", cluster.id)
    task = sky.Task.from_yaml_config(cluster_task(spec, cluster, agent))
    mounts = {path: {"source": storage.source, "mode": storage.mode.value}
              for path, storage in task.storage_mounts.items()}
    # A dry run still looks the bucket up (with the cloud's credentials) before it renders the
    # cluster config, which the mount does not change: render without it.
    task.storage_mounts = {}
    execution.launch(task, cluster_name=name, dryrun=True, stream_logs=False)
    rendered = Path(os.path.expanduser(f"~/.sky/generated/{name}.yml.tmp"))
    (resources,) = task.resources
    return {
        "task": {"num_nodes": task.num_nodes, "cloud": str(resources.cloud), "region": resources.region,
                 "zone": resources.zone, "instance_type": resources.instance_type, "use_spot": resources.use_spot,
                 "accelerators": resources.accelerators, "disk_size": resources.disk_size,
                 "storage_mounts": mounts, "file_mounts": task.file_mounts, "setup": task.setup},
        "config": yaml.safe_load(rendered.read_text()),
    }


def catalog_quotes(accelerators: list[str]) -> list[dict[str, Any]]:
    from broker.market.sky_catalog import SkyCatalogMarket

    quotes = SkyCatalogMarket(lambda: accelerators).quotes(__import__("datetime").datetime.now())
    return [{"cloud": q.cloud, "region": q.region, "zone": q.zone, "instance_type": q.instance_type,
             "accelerator": q.accelerator, "gpus": q.gpus_per_node, "spot": q.spot_price,
             "on_demand": q.on_demand_price} for q in quotes]


def main() -> None:
    request = json.load(sys.stdin)
    enable_clouds()
    out = {"renders": [render(case) for case in request["cases"]],
           "quotes": catalog_quotes(request["accelerators"])}
    print("\n" + json.dumps(out, default=str))


if __name__ == "__main__":
    main()
