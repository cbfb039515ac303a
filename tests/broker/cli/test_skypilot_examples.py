"""SkyPilot's own example task files run on the embedded default: the bundled market offers their GPUs."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from providers.catalog import GPU_INSTANCE_TYPES
from providers.trace import read_trace

ROOT = Path(__file__).resolve().parents[3]
EXAMPLES = Path(__file__).parent / "skypilot_examples"
BUNDLED = ROOT / "broker" / "data" / "quickstart-market.csv"


def _broker(home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    # The jobs must never start: their setup installs PyTorch. Provisioning takes a market day.
    env = {**os.environ, "BROKER_HOME": str(home), "BROKER_LOCAL_PROVISION_SECONDS": "86400", "BROKER_SPEED": "1"}
    for name in ("BROKER_SERVER", "BROKER_MARKET", "BROKER_BACKEND"):
        env.pop(name, None)
    return subprocess.run([sys.executable, "-m", "broker", *args], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=300)


def test_the_bundled_market_offers_every_catalog_type_on_its_cloud() -> None:
    trace = read_trace(BUNDLED)
    offered = {(z.key.cloud, z.key.instance_type, z.accelerator, z.gpus_per_node) for z in trace.zones}
    for t in GPU_INSTANCE_TYPES:
        if t.cloud == "gcp" and t.attached and (t.cloud, t.name) in {(c, n) for c, n, _, _ in offered} \
                and (t.cloud, t.name, t.accelerator, t.gpus) not in offered:
            continue  # a GCP n1 type listed once per attachable GPU is offered with its first one
        assert (t.cloud, t.name, t.accelerator, t.gpus) in offered, t


@pytest.mark.slow
@pytest.mark.timeout(1200)
def test_skypilot_example_task_files_are_accepted_by_a_detached_local_launch(tmp_path: Path) -> None:
    home = tmp_path / "home"
    job_ids = []
    try:
        for name in ("distributed-pytorch-train.yaml", "vllm-serve.yaml", "vicuna-train.yaml",
                     "gpt-oss-20b-sft.yaml"):
            launched = _broker(home, "launch", str(EXAMPLES / name), "--backend", "local", "--detach")
            assert launched.returncode == 0, (name, launched.stderr)
            match = re.search(r"submitted (j-[0-9a-f]+)", launched.stdout)
            assert match, launched.stdout
            job_ids.append(match.group(1))
    finally:
        for job_id in job_ids:
            _broker(home, "cancel", job_id)


@pytest.mark.slow
def test_an_accelerator_no_catalog_knows_is_still_refused(tmp_path: Path) -> None:
    job = tmp_path / "x900.yaml"
    job.write_text("resources:\n  accelerators: X900:8\nrun: echo hi\n")
    refused = _broker(tmp_path / "home", "launch", str(job), "--backend", "local", "--detach")
    assert refused.returncode == 2
    assert "unknown accelerator 'X900'" in refused.stderr and "Traceback" not in refused.stderr
    assert not (tmp_path / "home" / "broker.db").exists() or "j-" not in _broker(tmp_path / "home", "status").stdout
