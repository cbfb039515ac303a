"""The checkpoint contract for PyTorch Lightning: a ``Callback`` that saves through the ``Trainer``.

::

    broker_ckpt = BrokerCheckpoint(every_steps=100)
    trainer = Trainer(callbacks=[broker_ckpt], ...)
    trainer.fit(model, datamodule, ckpt_path=broker_ckpt.resume_path())

When a checkpoint is asked for (the signal, on any rank) every rank calls ``trainer.save_checkpoint``
at the same step; the checkpoint is renamed into place and ``LATEST`` is replaced by rank 0. A
mid-epoch resume is exact when the training dataloader is resumable (``state_dict``/``load_state_dict``,
as Lightning asks). Works with ``lightning`` and with the older ``pytorch_lightning`` package.
"""

from __future__ import annotations

import os
import zipfile
from typing import Any

from broker.job.contract import Checkpointer
from broker.job.pytorch import rng_state, set_rng_state

try:
    from lightning.pytorch import Callback, LightningModule, Trainer
except ImportError:  # the standalone package of Lightning 1.x/2.x
    from pytorch_lightning import Callback, LightningModule, Trainer  # type: ignore[no-redef,assignment]


RNG_KEY = "broker_rng_state"


def readable_checkpoint(path: str) -> str:
    """``path`` if it is a whole ``torch.save`` archive (every member's CRC checks); raises otherwise."""
    with zipfile.ZipFile(path) as archive:
        bad = archive.testzip()
    if bad is not None:
        raise ValueError(f"member {bad} is corrupt")
    return path


class BrokerCheckpoint(Callback):  # type: ignore[misc]
    def __init__(self, directory: str | os.PathLike[str] | None = None, *, every_steps: int | None = None,
                 keep: int = 2) -> None:
        super().__init__()
        self.contract = Checkpointer(directory, every_steps=every_steps, keep=keep)
        self._rng: dict[str, Any] | None = None

    def resume_path(self) -> str | None:
        """The checkpoint to pass as ``ckpt_path`` (the newest whole one), or None to start fresh."""
        return self.contract.resume(readable_checkpoint)

    def setup(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        self.contract.rank = trainer.global_rank
        if trainer.world_size > 1:
            self.contract.agree = lambda asked: bool(trainer.strategy.reduce_boolean_decision(asked, all=False))
            self.contract.barrier = trainer.strategy.barrier

    def on_save_checkpoint(self, trainer: Trainer, pl_module: LightningModule, checkpoint: dict[str, Any]) -> None:
        # Lightning keeps no random state in its checkpoints: dropout after a resume would draw anew.
        checkpoint[RNG_KEY] = rng_state()

    def on_load_checkpoint(self, trainer: Trainer, pl_module: LightningModule, checkpoint: dict[str, Any]) -> None:
        if RNG_KEY in checkpoint:
            self._rng = checkpoint[RNG_KEY]

    def on_train_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if self._rng is not None:  # set last, after everything restoring the checkpoint may have drawn
            set_rng_state(self._rng)
            self._rng = None

    def on_train_batch_end(self, trainer: Trainer, pl_module: LightningModule, outputs: Any, batch: Any,
                           batch_idx: int) -> None:
        step = trainer.global_step
        total = trainer.max_steps if trainer.max_steps and trainer.max_steps > 0 else None
        self.contract.progress(step, total)
        if self.contract.should_save(step):
            self.contract.save(step, trainer.save_checkpoint, all_ranks=True)
