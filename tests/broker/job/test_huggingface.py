"""broker.job.huggingface with the real Transformers Trainer on the CPU (a tiny GPT-2 from a config)."""

from __future__ import annotations

import os
import random
import signal
from pathlib import Path
from typing import Any

import pytest

from broker.job import read_marker
from tests.broker.job.shipped import Died, load_example

STEPS = 24


@pytest.fixture(scope="module")
def transformers() -> Any:
    """Transformers, imported by the tests that use it, not when the suite is collected (seconds per worker)."""
    pytest.importorskip("torch")
    return pytest.importorskip("transformers")


def train(transformers: Any, module, signal_at: int | None = None, die_after: int | None = None) -> dict[str, object]:
    from broker.job.huggingface import BrokerTrainerCallback

    class Preemption(transformers.TrainerCallback):  # type: ignore[misc,name-defined]
        def on_step_end(self, args, state, control, **kwargs) -> None:
            if state.global_step == signal_at:
                os.kill(os.getpid(), signal.SIGUSR1)
            if state.global_step == die_after:
                raise Died

    broker_ckpt = BrokerTrainerCallback()
    model = module.tiny_model()
    trainer = transformers.Trainer(model=model, args=module.arguments(broker_ckpt.output_dir, STEPS),
                                   train_dataset=module.Sequences(count=40),  # 5 steps an epoch
                                   callbacks=[Preemption(), broker_ckpt])
    trainer.train(resume_from_checkpoint=broker_ckpt.resume_path())
    assert trainer.state.global_step == STEPS
    return model.state_dict()


def test_a_train_interrupted_at_a_random_step_ends_bit_identical(tmp_path: Path, monkeypatch, capsys,
                                                                 transformers: Any) -> None:
    torch = pytest.importorskip("torch")

    for name in ("BROKER_RESUME_FROM", "RANK", "SKYPILOT_NODE_RANK", "BROKER_CHECKPOINT_SIGNAL"):
        monkeypatch.delenv(name, raising=False)
    module: Any = load_example("train_huggingface")
    original = signal.getsignal(signal.SIGUSR1)
    at = random.Random().randint(1, STEPS - 5)
    try:
        monkeypatch.setenv("BROKER_CHECKPOINT_DIR", str(tmp_path / "a"))
        uninterrupted = train(transformers, module)
        monkeypatch.setenv("BROKER_CHECKPOINT_DIR", str(tmp_path / "b"))
        with pytest.raises(Died):
            train(transformers, module, signal_at=at, die_after=at + 3)
        path, step = read_marker(tmp_path / "b")  # type: ignore[misc]
        assert step == at and (path / "optimizer.pt").is_file() and (path / "trainer_state.json").is_file()
        monkeypatch.setenv("BROKER_RESUME_FROM", str(path))
        resumed = train(transformers, module)
    finally:
        signal.signal(signal.SIGUSR1, original)
    out = capsys.readouterr().out
    assert f"BROKER_PROGRESS step={STEPS} total={STEPS}" in out
    assert f"checkpoint step-{at:08d} (on notice) saved in" in out
    for name, tensor in uninterrupted.items():
        assert torch.equal(tensor, resumed[name]), (name, at)


def test_a_checkpoint_without_its_trainer_state_is_skipped(tmp_path: Path, monkeypatch, capsys,
                                                           transformers: Any) -> None:
    from broker.job.huggingface import BrokerTrainerCallback

    monkeypatch.setenv("BROKER_CHECKPOINT_DIR", str(tmp_path))
    for step, state in ((4, '{"global_step": 4}'), (8, '{"global_st')):
        (tmp_path / f"step-{step:08d}").mkdir()
        (tmp_path / f"step-{step:08d}" / "trainer_state.json").write_text(state)
    monkeypatch.setenv("BROKER_RESUME_FROM", str(tmp_path / "step-00000008"))
    try:
        assert BrokerTrainerCallback().resume_path() == str((tmp_path / "step-00000004").resolve())
    finally:
        signal.signal(signal.SIGUSR1, signal.SIG_DFL)
    assert "cannot resume from step-00000008: JSONDecodeError" in capsys.readouterr().err
