"""The agent puts the job-side helper on the job's PYTHONPATH: ``import broker.job`` needs no install."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from broker.agent.jobpath import job_pythonpath, with_pythonpath

JOB = ("import os, broker.job, broker.job.contract; "
       "print('HELPER', broker.job.__file__); print('SIGNAL', os.environ['BROKER_CHECKPOINT_SIGNAL']); "
       "print('PATH', os.environ['PYTHONPATH'])")


def _agent(tmp_path: Path, job: list[str], env: dict[str, str]) -> str:
    status = tmp_path / "status"
    command = [sys.executable, "-m", "broker.agent", "--cloud", "auto", "--metadata-url", "http://127.0.0.1:9",
               "--poll", "50ms", "--signal", "SIGUSR2",
               "--checkpoint-dir", str(tmp_path / "ckpt"), "--status-file", str(status), "--", *job]
    result = subprocess.run(command, env=env, capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout


def test_a_job_without_the_broker_installed_imports_the_helper(tmp_path: Path) -> None:
    # -S: the job's Python sees no site-packages (where the broker is installed), only PYTHONPATH.
    out = _agent(tmp_path, [sys.executable, "-S", "-c", JOB], {**os.environ, "PYTHONPATH": "/users/own/path"})
    shim = tmp_path / "status.pythonpath"
    assert f"HELPER {shim / 'broker' / 'job' / '__init__.py'}" in out
    assert "SIGNAL SIGUSR2" in out
    assert f"PATH {shim}{os.pathsep}/users/own/path" in out  # the job's own path stays, after ours


def test_with_the_broker_installed_too_the_rest_of_the_package_still_imports(tmp_path: Path) -> None:
    folder = job_pythonpath(tmp_path / "shim")
    env = with_pythonpath({k: v for k, v in os.environ.items() if k != "PYTHONPATH"}, folder)
    code = "import broker.job, broker.agent.checkpoint as c; print(broker.job.__file__); print(c.__file__)"
    helper, agent = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                                   check=True, cwd=tmp_path).stdout.split()
    assert Path(helper).is_relative_to(folder)
    assert not Path(agent).is_relative_to(folder)
