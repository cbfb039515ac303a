"""The checkpoint contract for plain PyTorch loops, single process or ``torchrun``/DDP.

::

    ckpt = TorchCheckpointer(every_steps=100, total_steps=steps)
    state = ckpt.resume()                      # None on a fresh start
    if state is not None:
        model.load_state_dict(state["model"]); opt.load_state_dict(state["optimizer"]); step = state["step"]
    while step < steps:
        ...one step...
        step += 1
        ckpt.progress(step)
        if ckpt.should_save(step):             # every rank, every step: the decision is agreed
            ckpt.save(step, {"model": model.state_dict(), "optimizer": opt.state_dict(), "step": step})

Under ``torch.distributed`` the rank, the agreement (an all-reduce of one flag) and the barrier
come from the default process group; ``save`` writes from rank 0 only, ``save_sharded`` from every
rank through ``torch.distributed.checkpoint``.
"""

from __future__ import annotations

import os
import random
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from broker.job.contract import Checkpointer


def distributed() -> bool:
    return dist.is_available() and dist.is_initialized()


def any_rank(flag: bool) -> bool:
    """True on every rank when ``flag`` is True on any rank (an all-reduce of one integer)."""
    device = torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else None
    value = torch.tensor([1 if flag else 0], dtype=torch.int32, device=device)
    dist.all_reduce(value, op=dist.ReduceOp.MAX)
    return bool(value.item())


def rng_state() -> dict[str, Any]:
    """The random number generators' states (Python's, torch's CPU and CUDA ones), to save with a checkpoint."""
    state: dict[str, Any] = {"python": random.getstate(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


class TorchCheckpointer:
    """:class:`broker.job.Checkpointer` with ``torch.save``/``torch.load`` and the process group's collectives."""

    def __init__(self, directory: str | os.PathLike[str] | None = None, *, every_steps: int | None = None,
                 total_steps: int | None = None, keep: int = 2, writer_rank: int = 0,
                 map_location: str | torch.device | None = "cpu") -> None:
        gang = distributed()
        self.contract = Checkpointer(
            directory, every_steps=every_steps, total_steps=total_steps, keep=keep, writer_rank=writer_rank,
            rank=dist.get_rank() if gang else None, agree=any_rank if gang else None,
            barrier=dist.barrier if gang else None)
        self.map_location = map_location

    @property
    def directory(self) -> Path:
        return self.contract.directory

    @property
    def resumed_from(self) -> Path | None:
        return self.contract.resumed_from

    @property
    def save_seconds(self) -> list[float]:
        return self.contract.save_seconds

    def should_save(self, step: int) -> bool:
        return self.contract.should_save(step)

    def progress(self, step: int, total: int | None = None) -> None:
        self.contract.progress(step, total)

    def resume(self) -> Any:
        """The state saved by :meth:`save` in the checkpoint to resume from, or None."""
        return self.contract.resume(lambda path: torch.load(path, map_location=self.map_location))

    def save(self, step: int, state: Any) -> bool:
        """``torch.save(state)`` as checkpoint ``step`` (rank ``writer_rank`` writes; the others wait)."""
        return self.contract.save(step, lambda path: torch.save(state, path))

    def save_with(self, step: int, write: Callable[[str], Any], *, all_ranks: bool = False) -> bool:
        """Save with any writer (``safetensors.torch.save_file``, ...): ``write(path)``."""
        return self.contract.save(step, write, all_ranks=all_ranks)

    def save_sharded(self, step: int, state: dict[str, Any]) -> bool:
        """Every rank writes its shards of ``state`` with ``torch.distributed.checkpoint``."""
        import torch.distributed.checkpoint as dcp

        return self.contract.save(step, lambda path: dcp.save(state, checkpoint_id=path), all_ranks=True)

    def resume_sharded(self, state: dict[str, Any]) -> bool:
        """Load a sharded checkpoint into ``state`` in place; False when starting fresh."""
        import torch.distributed.checkpoint as dcp

        def load(path: str) -> bool:
            dcp.load(state, checkpoint_id=path)
            return True

        return self.contract.resume(load) is not None
