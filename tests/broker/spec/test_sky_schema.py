"""The broker's copy of SkyPilot's schema refuses what SkyPilot's schema refuses, in SkyPilot's words,
without importing SkyPilot; and it is the installed SkyPilot's schema."""

from __future__ import annotations

import copy
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from broker.spec.job import SpecError, parse_job_file
from broker.spec.sky_schema import SkyRefusal, check, schemas
from broker.spec.skypilot import validate_task
from broker.spec.yaml_lines import load_yaml_documents

ROOT = Path(__file__).resolve().parents[3]
SKY_FILES = sorted((ROOT / "tests" / "broker" / "specs" / "skypilot").glob("*.yaml"))
OUR_FILES = sorted((ROOT / "examples").rglob("*.yaml")) + sorted((ROOT / "tests/broker/cli/skypilot_examples")
                                                                  .glob("*.yaml"))
BASE = "name: t\nresources:\n  accelerators: V100:1\nrun: python train.py\n"
HOSTILE = {
    "unknown-key": BASE + "not_a_skypilot_key: 1\n",
    "near-miss-key": BASE + "num_node: 2\n",
    "num-nodes-text": BASE + "num_nodes: two\n",
    "bad-env-name": BASE + "envs:\n  1BAD: x\n",
    "env-without-value": BASE + "envs:\n  TOKEN:\n",
    "resources-unknown": BASE.replace("  accelerators", "  spot_recovery: none\n  accelerators"),
    "use-spot-text": BASE.replace("  accelerators", "  use_spot: maybe\n  accelerators"),
    "gpus-and-accelerators": BASE.replace("  accelerators", "  gpus: A100:1\n  accelerators"),
    "any-of-unknown": "name: t\nresources:\n  any_of:\n    - accelerators: V100:1\n      colour: blue\nrun: x\n",
    "resources-hooks": BASE.replace("  accelerators", "  hooks: []\n  accelerators"),
    "resources-list": "name: t\nresources: [V100]\nrun: x\n",
    "run-list": "name: t\nrun: [a, b]\n",
}


def _task(text: str) -> dict[str, Any]:
    [doc] = load_yaml_documents(text, "job.yaml")
    return {k: v for k, v in doc.data.items() if k != "broker"}


def _skypilot_says(text: str) -> str | None:
    """SkyPilot's own verdict on the file (imports it), as the broker words it."""
    [doc] = load_yaml_documents(text, "job.yaml")
    try:
        validate_task(copy.deepcopy(_task(text)), doc, "job.yaml")
    except SpecError as exc:
        return str(exc)
    return None


def _copy_says(text: str) -> str | None:
    try:
        parse_job_file(text, source="job.yaml", offline=True, skypilot=False)
    except SpecError as exc:
        return str(exc)
    return None


def test_the_copy_is_the_installed_skypilots_schema() -> None:
    from sky import resources
    from sky.utils import schemas as sky_schemas

    copied = schemas()
    assert copied["task"] == sky_schemas.get_task_schema(), "run scripts/skypilot_schema.py"
    assert copied["resources"] == sky_schemas.get_resources_schema(), "run scripts/skypilot_schema.py"
    assert copied["resource_aliases"] == resources.RESOURCE_CONFIG_ALIASES


@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_a_file_skypilots_schema_refuses_is_refused_in_skypilots_words_on_the_same_field(name: str) -> None:
    text = HOSTILE[name]
    skypilot = _skypilot_says(text)
    assert skypilot is not None and "SkyPilot:" in skypilot
    assert _copy_says(text) == skypilot


@pytest.mark.parametrize("path", SKY_FILES + OUR_FILES, ids=lambda p: str(p.relative_to(ROOT)))
def test_the_copy_refuses_only_what_skypilot_refuses_and_says_the_same(path: Path) -> None:
    text = path.read_text()
    try:
        load_yaml_documents(text, path.name)
    except SpecError:
        pytest.skip("the broker's YAML reading refuses it before any schema")
    documents = [d for d in yaml.safe_load_all(text) if d is not None]
    if len(documents) != 1 or not isinstance(documents[0], dict):
        pytest.skip("a pipeline: SkyPilot's DAG loader judges it")
    try:
        check(_task(text))
    except SkyRefusal as exc:
        said = _skypilot_says(text)
        assert said is not None and str(exc) in said
    else:
        said = _skypilot_says(text)
        assert said is None or ("Invalid task YAML" not in said and "Invalid resources YAML" not in said)


def test_refusing_by_the_copy_imports_no_skypilot(tmp_path: Path) -> None:
    job = tmp_path / "job.yaml"
    job.write_text(HOSTILE["unknown-key"])
    code = ("import sys\nfrom broker.spec.job import SpecError, load_job_file\n"
            "try:\n    load_job_file(sys.argv[1])\nexcept SpecError as exc:\n    print(exc)\n"
            "print('sky' in sys.modules)\n")
    done = subprocess.run([sys.executable, "-c", code, str(job)], capture_output=True, text=True, timeout=120,
                          cwd=ROOT)
    assert done.stdout.splitlines() == [
        f"{job}:5: not_a_skypilot_key: SkyPilot: Invalid task YAML: Found unsupported field 'not_a_skypilot_key'.",
        "False"]
