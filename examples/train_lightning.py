"""A PyTorch Lightning job keeping the broker's checkpoint contract through ``broker.job.lightning``.

The training batches come from a resumable iterable (``state_dict``/``load_state_dict``), so a run
resumed mid-epoch sees the same batches as an uninterrupted one and ends bit-identical on the CPU.
It prints the SHA-256 of the final parameters.
"""

from __future__ import annotations

import argparse
import hashlib
import time
from collections.abc import Iterator
from typing import Any

import lightning.pytorch as pl
import torch
from torch import nn

from broker.job.lightning import BrokerCheckpoint


class SeededBatches:
    """Batch ``i`` of epoch ``e`` is drawn from a generator seeded by (e, i); the position is its state."""

    def __init__(self, batches: int, size: int = 32, width: int = 16) -> None:
        self.batches, self.size, self.width = batches, size, width
        self.epoch, self.position = 0, 0

    def __len__(self) -> int:
        return self.batches

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        while self.position < self.batches:
            generator = torch.Generator().manual_seed(self.epoch * 100_003 + self.position)
            x = torch.randn(self.size, self.width, generator=generator)
            self.position += 1
            yield x, torch.sin(x.sum(dim=1, keepdim=True))
        self.epoch, self.position = self.epoch + 1, 0

    def state_dict(self) -> dict[str, int]:
        return {"epoch": self.epoch, "position": self.position}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.epoch, self.position = int(state["epoch"]), int(state["position"])


class Regressor(pl.LightningModule):
    def __init__(self, width: int = 16, step_seconds: float = 0.0) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(width, width), nn.Tanh(), nn.Dropout(0.1), nn.Linear(width, 1))
        self.step_seconds = step_seconds

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
        started = time.monotonic()
        x, y = batch
        loss = nn.functional.mse_loss(self.net(x), y)
        time.sleep(max(0.0, self.step_seconds - (time.monotonic() - started)))  # stands for GPU time
        return loss

    def configure_optimizers(self) -> Any:
        return torch.optim.AdamW(self.parameters(), lr=1e-3)


def parameters_digest(model: nn.Module) -> str:
    digest = hashlib.sha256()
    for name, tensor in sorted(model.state_dict().items()):
        digest.update(name.encode() + tensor.detach().cpu().contiguous().numpy().tobytes())
    return digest.hexdigest()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=400)
    parser.add_argument("--batches-per-epoch", type=int, default=64)
    parser.add_argument("--step-seconds", type=float, default=0.0)
    parser.add_argument("--checkpoint-every", type=int, default=100)
    args = parser.parse_args()

    pl.seed_everything(0, verbose=False)
    model = Regressor(step_seconds=args.step_seconds)
    broker_ckpt = BrokerCheckpoint(every_steps=args.checkpoint_every)
    trainer = pl.Trainer(max_steps=args.steps, accelerator="cpu", devices=1, deterministic=True,
                         callbacks=[broker_ckpt], enable_checkpointing=False, logger=False,
                         enable_progress_bar=False, enable_model_summary=False)
    resume = broker_ckpt.resume_path()
    print(f"resumed from {resume}" if resume else "starting fresh", flush=True)
    trainer.fit(model, train_dataloaders=SeededBatches(args.batches_per_epoch), ckpt_path=resume)
    if trainer.is_global_zero:
        print(f"done: {trainer.global_step} steps, parameters sha256 {parameters_digest(model)}", flush=True)


if __name__ == "__main__":
    main()
