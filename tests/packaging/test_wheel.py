"""The built wheel installs into a clean environment next to an independently installed SkyPilot."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _uv() -> str:
    found = shutil.which("uv", path=str(Path(sys.executable).parent)) or shutil.which("uv")
    if found is None:
        pytest.skip("uv is not installed (scripts/setup.sh installs it)")
    return found


def _run(*command: str, cwd: Path = ROOT, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(list(command), cwd=cwd, env=env, capture_output=True, text=True, timeout=1500)
    assert done.returncode == 0, (command, done.stdout[-2000:], done.stderr[-3000:])
    return done


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_the_wheel_installs_next_to_the_newest_skypilot(tmp_path: Path) -> None:
    uv = _uv()
    _run(uv, "build", "--wheel", "--out-dir", str(tmp_path / "dist"), str(ROOT))
    wheel = next((tmp_path / "dist").glob("spot_broker-*.whl"))
    venv = tmp_path / "venv"
    _run(uv, "venv", "-q", "--python", sys.executable, str(venv))
    python = str(venv / "bin" / "python")
    # The user's own SkyPilot first, the newest release, installed on its own ...
    _run(uv, "pip", "install", "-q", "--python", python, "skypilot")
    sky_version = _run(python, "-c", "import importlib.metadata as m; print(m.version('skypilot'))").stdout.strip()
    # ... then the broker's wheel next to it, without a cloud extra.
    _run(uv, "pip", "install", "-q", "--python", python, str(wheel))
    assert _run(python, "-c", "import importlib.metadata as m; print(m.version('skypilot'))").stdout.strip() \
        == sky_version  # the broker did not replace the user's SkyPilot
    env = {k: v for k, v in os.environ.items() if not k.startswith("BROKER_")}
    env["BROKER_HOME"] = str(tmp_path / "home")
    version = _run(str(venv / "bin" / "broker"), "--version", cwd=tmp_path, env=env)
    assert version.stdout.strip().startswith("broker ")
    # The core has no cloud SDK: asking for live AWS prices names the extra instead of failing obscurely.
    missing = subprocess.run([str(venv / "bin" / "broker"), "prices", "--refresh", "--cloud", "aws"], cwd=tmp_path,
                             env=env, capture_output=True, text=True, timeout=300)
    boto3_present = subprocess.run([python, "-c", "import boto3"], capture_output=True).returncode == 0
    if not boto3_present:  # SkyPilot itself does not pull boto3 in
        assert missing.returncode == 1 and "pip install 'spot-broker[aws]'" in missing.stderr, missing.stderr
