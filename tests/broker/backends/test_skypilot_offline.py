"""SkyPilot itself, offline: the task it builds from the broker's and the cluster config its dry run renders.

A child process runs SkyPilot against hand-written catalogs in a temporary runtime directory
(``sky_offline``), so SkyPilot's process-wide state never touches this one.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from broker.backends.agent_wheel import build_agent_wheel
from tests.broker.backends.sky_offline import AWS_AMIS, sandbox_env, write_sandbox

REPO = Path(__file__).resolve().parents[3]


def _job(accelerators: str, nodes: int, checkpoint: str) -> str:
    return (f"name: train\nnum_nodes: {nodes}\nresources:\n  accelerators: {accelerators}\n  disk_size: 200\n"
            f"setup: pip install -r requirements.txt\nrun: python train.py\n"
            f"broker:\n  checkpoint:\n    dir: {checkpoint}\n")


def _cluster(cloud: str, region: str, zone: str, instance_type: str, nodes: int, gpus: int) -> dict[str, Any]:
    return {"id": f"j-0ff1ine0-{cloud}", "cloud": cloud, "region": region, "zone": zone,
            "instance_type": instance_type, "num_nodes": nodes, "gpus_per_node": gpus, "spot": True}


CASES = {
    "aws": (_job("V100:4", 2, "s3://ckpt-bucket/train"),
            _cluster("aws", "us-east-1", "us-east-1b", "p3.8xlarge", 2, 4)),
    "gcp": (_job("A100:8", 3, "gs://ckpt-bucket/train"),
            _cluster("gcp", "us-central1", "us-central1-b", "a2-highgpu-8g", 3, 8)),
    "azure": (_job("A100-80GB:1", 2, "az://ckptaccount/ckpt/train"),
              _cluster("azure", "eastus", "eastus", "Standard_NC24ads_A100_v4", 2, 1)),
}


@pytest.fixture(scope="module")
def offline(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    root = tmp_path_factory.mktemp("sky-runtime")
    write_sandbox(root)
    wheel = build_agent_wheel(root / "wheels")
    request = {"cases": [{"job": job, "source": f"{cloud}.yaml", "cluster": cluster, "wheel": str(wheel)}
                         for cloud, (job, cluster) in CASES.items()],
               "accelerators": ["V100", "A100", "A100-80GB"]}
    done = subprocess.run([sys.executable, "-m", "tests.broker.backends.sky_offline"], input=json.dumps(request),
                          env=sandbox_env(root, REPO), cwd=REPO, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-4000:]
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    result["renders"] = dict(zip(CASES, result["renders"], strict=True))
    result["wheel"] = wheel
    assert not list((root / ".sky" / "catalogs" / "v8").glob(".meta/**/*.md5"))  # nothing was downloaded
    yield result


@pytest.mark.slow
@pytest.mark.parametrize("cloud", list(CASES))
def test_task_pins_the_offer_and_mounts_the_bucket(offline: dict[str, Any], cloud: str) -> None:
    task = offline["renders"][cloud]["task"]
    cluster = CASES[cloud][1]
    assert task["num_nodes"] == cluster["num_nodes"]
    assert (task["cloud"].lower(), task["region"], task["instance_type"], task["use_spot"]) == \
        (cloud, cluster["region"], cluster["instance_type"], True)
    assert task["zone"] == (None if cloud == "azure" else cluster["zone"])  # SkyPilot has no Azure zones
    assert task["disk_size"] == 200
    (mount,) = task["storage_mounts"].values()
    expected = {"aws": "s3://ckpt-bucket", "gcp": "gs://ckpt-bucket",
                "azure": "https://ckptaccount.blob.core.windows.net/ckpt"}[cloud]
    assert mount == {"source": expected, "mode": "MOUNT"}
    assert list(task["storage_mounts"]) == ["/broker-checkpoint"]
    assert task["file_mounts"][f"~/.broker-wheels/{offline['wheel'].name}"] == str(offline["wheel"])
    setup = task["setup"]
    assert setup.index("uv pip install") < setup.index("pip install -r requirements.txt")


@pytest.mark.slow
def test_aws_dry_run_renders_a_spot_gang_in_the_pinned_zone(offline: dict[str, Any]) -> None:
    config = offline["renders"]["aws"]["config"]
    assert config["provider"]["region"] == "us-east-1"
    assert config["provider"]["availability_zone"] == "us-east-1b"
    assert config["max_workers"] == 1  # 2 nodes: the head and one worker
    node = config["available_node_types"][config["head_node_type"]]["node_config"]
    assert node["InstanceType"] == "p3.8xlarge"
    assert node["InstanceMarketOptions"]["MarketType"] == "spot"
    # SkyPilot's GPU image from the hand-written images.csv (its CUDA 12 one: V100s predate CUDA 13).
    assert node["ImageId"] == AWS_AMIS["skypilot:custom-gpu-ubuntu"]


@pytest.mark.slow
def test_gcp_dry_run_renders_spot_provisioning_in_the_pinned_zone(offline: dict[str, Any]) -> None:
    config = offline["renders"]["gcp"]["config"]
    assert config["provider"]["availability_zone"] == "us-central1-b"
    assert config["max_workers"] == 2
    node = config["available_node_types"][config["head_node_type"]]["node_config"]
    assert node["machineType"] == "a2-highgpu-8g"
    assert node["scheduling"]["provisioningModel"] == "SPOT"
    assert node["guestAccelerators"][0]["acceleratorCount"] == 8


@pytest.mark.slow
def test_azure_dry_run_renders_spot_priority_in_the_region(offline: dict[str, Any]) -> None:
    config = offline["renders"]["azure"]["config"]
    assert config["provider"]["location"] == "eastus"
    assert config["max_workers"] == 1
    node = config["available_node_types"][config["head_node_type"]]["node_config"]
    assert node["azure_arm_parameters"]["vmSize"] == "Standard_NC24ads_A100_v4"
    assert node["azure_arm_parameters"]["priority"] == "Spot"


@pytest.mark.slow
def test_catalog_market_quotes_every_zone_at_its_own_spot_price(offline: dict[str, Any]) -> None:
    quotes = {(q["cloud"], q["zone"], q["instance_type"]): q for q in offline["quotes"]}
    assert set(quotes) == {
        ("aws", "us-east-1a", "p3.8xlarge"), ("aws", "us-east-1b", "p3.8xlarge"), ("aws", "us-west-2b", "p3.8xlarge"),
        ("gcp", "us-central1-a", "a2-highgpu-8g"), ("gcp", "us-central1-b", "a2-highgpu-8g"),
        ("azure", "eastus", "Standard_NC24ads_A100_v4"),
    }
    assert quotes[("aws", "us-east-1b", "p3.8xlarge")]["spot"] == pytest.approx(2.91)
    assert quotes[("aws", "us-east-1a", "p3.8xlarge")]["spot"] == pytest.approx(3.67)
    assert quotes[("aws", "us-east-1a", "p3.8xlarge")]["on_demand"] == pytest.approx(12.24)
    assert quotes[("gcp", "us-central1-b", "a2-highgpu-8g")]["gpus"] == 8
    assert quotes[("azure", "eastus", "Standard_NC24ads_A100_v4")]["accelerator"] == "A100-80GB"
