"""broker.job.pytorch with the real PyTorch on the CPU: a plain loop and a 2-rank torchrun gang (gloo)."""

from __future__ import annotations

import os
import random
import re
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from broker.job import read_marker
from tests.broker.job.shipped import Died

ROOT = Path(__file__).resolve().parents[3]
STEPS = 40


@pytest.fixture(scope="module")
def torch() -> Any:
    """PyTorch, imported by the tests that use it, not when the suite is collected (seconds per worker)."""
    return pytest.importorskip("torch")


def train(torch: Any, die_after: int | None = None, signal_at: int | None = None) -> dict[str, object]:
    from broker.job.pytorch import TorchCheckpointer

    torch.use_deterministic_algorithms(True)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Dropout(0.1), torch.nn.Linear(16, 1))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    ckpt = TorchCheckpointer(total_steps=STEPS)
    step = 0
    state = ckpt.resume()
    if state is not None:
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        torch.set_rng_state(state["rng"])  # dropout draws from the global generator
        step = state["step"]
    while step < STEPS:
        x = torch.randn(32, 8)
        loss = torch.nn.functional.mse_loss(model(x), x.sum(dim=1, keepdim=True))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        step += 1
        if step == signal_at:
            os.kill(os.getpid(), signal.SIGUSR1)
        if ckpt.should_save(step):
            ckpt.save(step, {"model": model.state_dict(), "optimizer": optimizer.state_dict(), "step": step,
                             "rng": torch.get_rng_state()})
        if die_after is not None and step == die_after:
            raise Died
    return model.state_dict()


def test_a_run_interrupted_at_a_random_step_ends_bit_identical(tmp_path: Path, monkeypatch, torch: Any) -> None:
    for name in ("BROKER_RESUME_FROM", "RANK", "SKYPILOT_NODE_RANK", "BROKER_CHECKPOINT_SIGNAL"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("BROKER_CHECKPOINT_DIR", str(tmp_path / "ckpt"))
    original = signal.getsignal(signal.SIGUSR1)
    try:
        uninterrupted = train(torch)
        monkeypatch.setenv("BROKER_CHECKPOINT_DIR", str(tmp_path / "ckpt2"))
        at = random.Random().randint(1, STEPS - 5)
        with pytest.raises(Died):
            train(torch, signal_at=at, die_after=at + 3)  # the steps after the checkpoint are lost
        path, step = read_marker(tmp_path / "ckpt2")  # type: ignore[misc]
        assert step == at
        monkeypatch.setenv("BROKER_RESUME_FROM", str(path))
        resumed = train(torch)
    finally:
        signal.signal(signal.SIGUSR1, original)
    assert resumed.keys() == uninterrupted.keys()
    for name, tensor in uninterrupted.items():
        assert torch.equal(tensor, resumed[name]), (name, at)


def _torchrun(tmp_path: Path, *args: str, resume: str = "") -> subprocess.Popen[str]:
    env = {**os.environ, "BROKER_CHECKPOINT_DIR": str(tmp_path / "ckpt"), "BROKER_RESUME_FROM": resume,
           "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"}
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
               str(ROOT / "examples" / "train_pytorch.py"), "--steps", "30", "--checkpoint-every", "1000",
               "--sharded", "--width", "8", *args]
    return subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            cwd=tmp_path)


def _finish(process: subprocess.Popen[str], lines: list[str]) -> str:
    assert process.stdout is not None
    lines += process.stdout.readlines()
    assert process.wait(timeout=120) == 0, "".join(lines)[-3000:]
    [digest] = [m.group(1) for line in lines if (m := re.search(r"parameters sha256 (\w+)", line))]
    return digest


@pytest.mark.slow
def test_a_torchrun_gang_signalled_on_one_rank_checkpoints_every_rank_at_one_step(tmp_path: Path, torch: Any) -> None:
    process = _torchrun(tmp_path, "--step-seconds", "0.05")
    assert process.stdout is not None
    lines: list[str] = []
    pids: dict[int, int] = {}
    try:
        for line in process.stdout:
            lines.append(line)
            if m := re.match(r"rank (\d) pid (\d+)", line):
                pids[int(m.group(1))] = int(m.group(2))
            if line.startswith("step 5 ") and len(pids) == 2:
                os.kill(pids[1], signal.SIGUSR1)  # the signal reaches rank 1 only
            if "(on notice)" in line:
                break
        digest = _finish(process, lines)
    finally:
        process.kill()
        process.wait()
    [saved] = [m.group(1) for line in lines if (m := re.search(r"checkpoint (step-\d+) \(on notice\)", line))]
    shards = sorted(p.name for p in (tmp_path / "ckpt" / saved).iterdir())
    assert shards == [".metadata", "__0_0.distcp", "__1_0.distcp"]  # both ranks wrote theirs at that step
    assert read_marker(tmp_path / "ckpt") == ((tmp_path / "ckpt" / saved).resolve(), int(saved[5:]))

    resumed = _torchrun(tmp_path, resume=str(tmp_path / "ckpt" / saved))
    try:
        lines = []
        assert _finish(resumed, lines) == digest
    finally:
        resumed.kill()
        resumed.wait()
    assert any(f"resumed at step {int(saved[5:])}" in line for line in lines)
