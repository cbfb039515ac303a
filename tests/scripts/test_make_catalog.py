"""scripts/make_catalog.py: the committed catalog is its output, from the excerpts or from a full cache."""

from __future__ import annotations

import csv
import io
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "make_catalog.py"
SOURCES = ROOT / "scripts" / "catalog_sources"
CATALOG = ROOT / "providers" / "catalog_data.csv"
ACCELERATORS = ROOT / "providers" / "catalog_accelerators.csv"
COLUMNS = ("cloud", "instance_type", "accelerator", "gpus", "gpu_memory_gb", "vcpus", "memory_gb", "attached",
           "interconnect")


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, cwd=ROOT,
                          timeout=300)


def body(path: Path) -> list[str]:
    """The rows of a generated file, without its header comment (which names the sources)."""
    return [line for line in path.read_text().splitlines() if not line.startswith("#")]


def test_the_committed_catalog_is_the_scripts_output_from_the_excerpts(tmp_path: Path) -> None:
    done = run("--out", str(tmp_path / "catalog_data.csv"))
    assert done.returncode == 0, done.stderr
    assert body(tmp_path / "catalog_data.csv") == body(CATALOG)
    assert body(tmp_path / "catalog_accelerators.csv") == body(ACCELERATORS)
    assert "125 GPU (aws 57, gcp 29, azure 39) and 113 CPU-only" in done.stderr


def _full_cache(root: Path) -> None:
    """A SkyPilot-style cache built from the excerpts: several zones per type, prices, SkyPilot's header.
    Without the Microsoft Learn rows, which SkyPilot's files lack."""
    for cloud in ("aws", "gcp", "azure"):
        rows = []
        for path in sorted(p for p in SOURCES.glob(f"*{cloud}_*vms.csv") if not p.name.startswith("msdocs_")):
            text = "".join(line for line in path.read_text().splitlines(keepends=True) if not line.startswith("#"))
            rows.extend(csv.DictReader(io.StringIO(text)))
        out = io.StringIO()
        fields = ["InstanceType", "AcceleratorName", "AcceleratorCount", "vCPUs", "MemoryGiB", "GpuInfo", "Price",
                  "SpotPrice", "Region", "AvailabilityZone"]
        writer = csv.DictWriter(out, fieldnames=fields, lineterminator="\n", extrasaction="ignore")
        writer.writeheader()
        for row in sorted(rows, key=lambda r: r["InstanceType"]):
            for zone in ("a", "b"):
                writer.writerow({**row, "Price": "1.5", "SpotPrice": "0.5", "Region": "r1", "AvailabilityZone": zone})
        (root / cloud).mkdir(parents=True)
        (root / cloud / "vms.csv").write_text(out.getvalue())
    (root / "common").mkdir()
    shutil.copy(SOURCES / "skypilot_accelerators.csv", root / "common" / "accelerators.csv")


def test_a_full_cache_regenerates_the_same_catalog_and_excerpts(tmp_path: Path) -> None:
    cache = tmp_path / "v8"
    _full_cache(cache)
    done = run("--from", str(cache), "--out", str(tmp_path / "catalog_data.csv"))
    assert done.returncode == 0, done.stderr
    assert body(tmp_path / "catalog_data.csv") == body(CATALOG)
    # The excerpt step reduces the cache to one row per type, from which the catalog is the same again.
    excerpts = tmp_path / "excerpts"
    excerpts.mkdir()
    done = run("--from", str(cache), "--excerpt", str(excerpts))
    assert done.returncode == 0, done.stderr
    aws = body(excerpts / "skypilot_aws_gpu_vms.csv")
    assert aws[0] == "InstanceType,AcceleratorName,AcceleratorCount,vCPUs,MemoryGiB,GpuInfo"
    assert len(aws) - 1 == len({line.split(",")[0] for line in aws[1:]})  # one row per type
    # SkyPilot's excerpt stays SkyPilot's: the Microsoft Learn sizes are read from their own file.
    azure = body(excerpts / "skypilot_azure_gpu_vms.csv")
    assert not [line for line in azure if line.startswith(("Standard_ND96isr_H200_v5,", "Standard_D8s_v5,"))]
    assert [line for line in azure if line.startswith("Standard_ND96isr_H100_v5,")]
    shutil.copy(SOURCES / "skypilot_accelerators.csv", excerpts)
    done = run("--from", str(excerpts), "--out", str(tmp_path / "again.csv"))
    assert done.returncode == 0, done.stderr
    assert body(tmp_path / "again.csv") == body(CATALOG)


@pytest.mark.parametrize(("args", "message"), [
    (["--from", "/nonexistent-dir"],
     "--from /nonexistent-dir: no <cloud>/vms.csv and no *<cloud>_*vms.csv files there"),
    (["--excerpt", "/nonexistent-dir"], "--excerpt /nonexistent-dir: not a directory"),
])
def test_missing_inputs_are_one_line_and_exit_2(args: list[str], message: str, tmp_path: Path) -> None:
    done = run(*args, "--out", str(tmp_path / "out.csv"))
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [f"make_catalog: {message}"]
    assert not (tmp_path / "out.csv").exists()


GARBAGE = [
    b"\x00\x00\x00",
    b"InstanceType,AcceleratorName,AcceleratorCount\n" + b"p5.48xlarge,H100,\xff\xfe\n",
    b"\"" + b"x" * 200_000,
    b"InstanceType,AcceleratorName,AcceleratorCount,vCPUs\n" + b"p5.48xlarge,H100,-1e308,nan\n" * 1000,
]


@pytest.mark.parametrize("garbage", [
    *GARBAGE,
    b"InstanceType,AcceleratorName,AcceleratorCount,vCPUs,MemoryGiB,GpuInfo\n"
    b"Standard_ND96isr_H200_v5,H200,8,96,1850,\"{'Gpus': [{'MemoryInfo': {'SizeInMiB': 1e400}}]}\"\n"
    b"Standard_D8s_v5,,,8,-32,\n" + b"Standard_X,H200,1e9,96,1850,\n",
])
def test_a_garbage_vendor_excerpt_is_refused_in_one_line_or_adds_nothing(garbage: bytes, tmp_path: Path) -> None:
    (tmp_path / "msdocs_azure_vms.csv").write_bytes(garbage)
    done = run("--vendor", str(tmp_path), "--out", str(tmp_path / "out.csv"), "--extra", "")
    assert "Traceback" not in done.stderr
    if done.returncode == 2:
        assert len(done.stderr.strip().splitlines()) == 1 and not (tmp_path / "out.csv").exists()
    else:
        assert done.returncode == 0
        rows = body(tmp_path / "out.csv")
        assert not [r for r in rows if r.startswith(("azure,Standard_D8s_v5", "azure,Standard_X"))]
        # an unreadable GpuInfo is no figure: the GB per GPU is the vendor's, as for any H200
        assert [r for r in rows if r.startswith("azure,Standard_ND96isr_H200")] in (
            [], ["azure,Standard_ND96isr_H200_v5,H200,8,141,96,1850,0,nvswitch"])
        assert any(r.startswith("azure,Standard_ND96isr_H100_v5,H100,8,") for r in rows)  # SkyPilot's rows stay


@pytest.mark.parametrize("garbage", GARBAGE)
def test_garbage_cache_files_are_refused_in_one_line_or_add_nothing(garbage: bytes, tmp_path: Path) -> None:
    (tmp_path / "aws").mkdir()
    (tmp_path / "aws" / "vms.csv").write_bytes(garbage)
    (tmp_path / "common").mkdir()
    shutil.copy(SOURCES / "skypilot_accelerators.csv", tmp_path / "common" / "accelerators.csv")
    done = run("--from", str(tmp_path), "--out", str(tmp_path / "out.csv"), "--extra", "", "--vendor", "")
    assert "Traceback" not in done.stderr
    if done.returncode == 2:
        assert len(done.stderr.strip().splitlines()) == 1 and not (tmp_path / "out.csv").exists()
    else:
        assert done.returncode == 0 and body(tmp_path / "out.csv") == [",".join(COLUMNS)]


def test_a_garbled_accelerator_list_is_one_line_and_writes_nothing(tmp_path: Path) -> None:
    shutil.copytree(SOURCES, tmp_path / "src")
    (tmp_path / "src" / "skypilot_accelerators.csv").write_text("AcceleratorName,Clouds\nX,not a list(\n")
    done = run("--from", str(tmp_path / "src"), "--out", str(tmp_path / "out.csv"))
    assert done.returncode == 2 and len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert done.stderr.startswith("make_catalog: SyntaxError") and not (tmp_path / "out.csv").exists()
