"""broker.job.lightning with the real PyTorch Lightning on the CPU."""

from __future__ import annotations

import os
import random
import signal
from pathlib import Path
from typing import Any

import pytest

from broker.job import read_marker
from tests.broker.job.shipped import Died, load_example

STEPS = 30


@pytest.fixture(scope="module")
def pl() -> Any:
    """Lightning, imported by the tests that use it, not when the suite is collected (seconds per worker)."""
    pytest.importorskip("torch")
    return pytest.importorskip("lightning.pytorch")


def train(pl: Any, module, signal_at: int | None = None, die_after: int | None = None) -> dict[str, object]:
    from broker.job.lightning import BrokerCheckpoint

    class Preemption(pl.Callback):  # type: ignore[misc,name-defined]
        """Sends the real checkpoint signal at one step and takes the process away a few steps later."""

        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
            if trainer.global_step == signal_at:
                os.kill(os.getpid(), signal.SIGUSR1)
            if trainer.global_step == die_after:
                raise Died

    pl.seed_everything(0, verbose=False)
    model = module.Regressor()
    broker_ckpt = BrokerCheckpoint()
    # The test's callback runs first, so the signal is seen by the broker's callback in the same step.
    trainer = pl.Trainer(max_steps=STEPS, accelerator="cpu", devices=1, deterministic=True,
                         callbacks=[Preemption(), broker_ckpt], enable_checkpointing=False,
                         logger=False, enable_progress_bar=False, enable_model_summary=False)
    trainer.fit(model, train_dataloaders=module.SeededBatches(7), ckpt_path=broker_ckpt.resume_path())
    assert trainer.global_step == STEPS
    return model.state_dict()


def test_a_fit_interrupted_mid_epoch_at_a_random_step_ends_bit_identical(tmp_path: Path, monkeypatch, pl: Any) -> None:
    torch = pytest.importorskip("torch")

    for name in ("BROKER_RESUME_FROM", "RANK", "SKYPILOT_NODE_RANK", "BROKER_CHECKPOINT_SIGNAL"):
        monkeypatch.delenv(name, raising=False)
    module: Any = load_example("train_lightning")
    original = signal.getsignal(signal.SIGUSR1)
    at = random.Random().randint(1, STEPS - 5)
    try:
        monkeypatch.setenv("BROKER_CHECKPOINT_DIR", str(tmp_path / "a"))
        uninterrupted = train(pl, module)
        monkeypatch.setenv("BROKER_CHECKPOINT_DIR", str(tmp_path / "b"))
        with pytest.raises(Died):
            train(pl, module, signal_at=at, die_after=at + 3)
        path, step = read_marker(tmp_path / "b")  # type: ignore[misc]
        assert step == at
        monkeypatch.setenv("BROKER_RESUME_FROM", str(path))
        resumed = train(pl, module)
    finally:
        signal.signal(signal.SIGUSR1, original)
    for name, tensor in uninterrupted.items():
        assert torch.equal(tensor, resumed[name]), (name, at)


def test_a_corrupt_checkpoint_is_skipped_for_the_one_before(tmp_path: Path, monkeypatch, capsys, pl: Any) -> None:
    torch = pytest.importorskip("torch")

    from broker.job.lightning import BrokerCheckpoint

    monkeypatch.setenv("BROKER_CHECKPOINT_DIR", str(tmp_path))
    torch.save({"x": torch.zeros(3)}, tmp_path / "step-00000003")
    (tmp_path / "step-00000006").write_bytes(b"PK\x03\x04" + b"\x00" * 64)  # a zip that stops short
    monkeypatch.setenv("BROKER_RESUME_FROM", str(tmp_path / "step-00000006"))
    try:
        assert BrokerCheckpoint().resume_path() == str((tmp_path / "step-00000003").resolve())
    finally:
        signal.signal(signal.SIGUSR1, signal.SIG_DFL)
    assert "cannot resume from step-00000006" in capsys.readouterr().err
