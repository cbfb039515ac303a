"""The checkpoint contract for the Hugging Face Transformers ``Trainer``: a ``TrainerCallback``.

::

    broker_ckpt = BrokerTrainerCallback()
    args = TrainingArguments(output_dir=broker_ckpt.output_dir, ...)
    trainer = Trainer(model=model, args=args, train_dataset=data, callbacks=[broker_ckpt])
    trainer.train(resume_from_checkpoint=broker_ckpt.resume_path())

When a checkpoint is asked for (the signal, on any rank) the callback sets ``control.should_save`` at
the end of that step on every rank; once the Trainer has written ``checkpoint-N`` (model, optimizer,
scheduler, random states, trainer state) it is moved to ``step-N`` and ``LATEST`` names it. The
Trainer's own periodic saves (``save_steps``) become contract checkpoints the same way. Progress is
``global_step`` of ``max_steps``.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path
from typing import Any

from transformers import TrainerCallback, TrainerControl, TrainerState, TrainingArguments

from broker.job.contract import Checkpointer

TRAINER_STATE = "trainer_state.json"


def readable_checkpoint(path: str) -> str:
    """``path`` if it is a whole Trainer checkpoint (its trainer state parses); raises otherwise."""
    with open(os.path.join(path, TRAINER_STATE), "rb") as handle:
        state = json.loads(handle.read(64 * 1024 * 1024))
    if not isinstance(state, dict) or not isinstance(state.get("global_step"), int):
        raise ValueError(f"{TRAINER_STATE} has no global_step")
    return path


def _distributed() -> tuple[Any, Any]:
    """(any-reduce, barrier) of the default process group, or (None, None) outside one."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return None, None
    from broker.job.pytorch import any_rank

    return any_rank, dist.barrier


class BrokerTrainerCallback(TrainerCallback):  # type: ignore[misc]
    def __init__(self, directory: str | os.PathLike[str] | None = None, *, every_steps: int | None = None,
                 keep: int = 2) -> None:
        self.contract = Checkpointer(directory, every_steps=every_steps, keep=keep)
        self._step_ended = time.perf_counter()

    @property
    def output_dir(self) -> str:
        """Where the Trainer writes ``checkpoint-N`` before it is moved into place (same filesystem)."""
        return str(self.contract.directory / ".trainer")

    def resume_path(self) -> str | None:
        """The checkpoint to pass as ``resume_from_checkpoint``, or None to start fresh."""
        return self.contract.resume(readable_checkpoint)

    def on_train_begin(self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
                       **kwargs: Any) -> None:
        self.contract.rank = args.process_index
        self.contract.agree, self.contract.barrier = _distributed()

    def on_step_end(self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
                    **kwargs: Any) -> None:
        self._step_ended = time.perf_counter()
        self.contract.progress(state.global_step, state.max_steps or None)
        if self.contract.should_save(state.global_step):
            control.should_save = True

    def on_save(self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
                **kwargs: Any) -> None:
        written = Path(args.output_dir or self.output_dir) / f"checkpoint-{state.global_step}"
        if self.contract.barrier is not None:
            self.contract.barrier()  # every rank has written its part (its random state) of the checkpoint

        def move(partial: str) -> None:
            shutil.move(str(written), partial)  # a rename within one filesystem

        self.contract.save(state.global_step, move, started=self._step_ended)
        if self.contract.barrier is not None:
            self.contract.barrier()
