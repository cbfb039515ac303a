"""A plain PyTorch loop that keeps the broker's checkpoint contract through ``broker.job.pytorch``.

Runs as one process or under ``torchrun`` (DDP: gloo on the CPU, NCCL on GPUs). Each step's batch is
drawn from a generator seeded by the step, so a resumed run sees the same data as an uninterrupted
one; with deterministic algorithms the final parameters are bit-identical. It prints their SHA-256.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import time

import torch
import torch.distributed as dist
from torch import nn

from broker.job.pytorch import TorchCheckpointer


def parameters_digest(model: nn.Module) -> str:
    digest = hashlib.sha256()
    for name, tensor in sorted(model.state_dict().items()):
        digest.update(name.encode() + tensor.detach().cpu().contiguous().numpy().tobytes())
    return digest.hexdigest()


def batch(step: int, rank: int, size: int, width: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(step * 1000 + rank)
    x = torch.randn(size, width, generator=generator)
    y = torch.sin(x.sum(dim=1, keepdim=True))
    return x.to(device), y.to(device)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--step-seconds", type=float, default=0.0, help="pace each step (stands for GPU time)")
    parser.add_argument("--checkpoint-every", type=int, default=100)
    parser.add_argument("--width", type=int, default=32)
    parser.add_argument("--depth", type=int, default=2)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--sharded", action="store_true", help="save with torch.distributed.checkpoint")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = parser.parse_args()

    torch.use_deterministic_algorithms(True)
    gang = int(os.environ.get("WORLD_SIZE", "1")) > 1
    device = torch.device(args.device)
    if gang:
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
        if device.type == "cuda":
            device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
            torch.cuda.set_device(device)
    rank = dist.get_rank() if gang else 0

    torch.manual_seed(0)
    layers: list[nn.Module] = []
    for _ in range(args.depth):
        layers += [nn.Linear(args.width, args.width), nn.Tanh()]
    model = nn.Sequential(*layers, nn.Linear(args.width, 1)).to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    trained: nn.Module = nn.parallel.DistributedDataParallel(model) if gang else model

    ckpt = TorchCheckpointer(every_steps=args.checkpoint_every, total_steps=args.steps)
    step = 0
    if args.sharded:
        from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

        # get_state_dict gives the optimizer's state its shape before the first step, for loading into.
        model_state, optimizer_state = get_state_dict(model, optimizer)
        state = {"model": model_state, "optimizer": optimizer_state, "step": torch.tensor(0)}
        if ckpt.resume_sharded(state):
            set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optimizer"])
            step = int(state["step"])
    else:
        saved = ckpt.resume()
        if saved is not None:
            model.load_state_dict(saved["model"])
            optimizer.load_state_dict(saved["optimizer"])
            step = int(saved["step"])
    print(f"rank {rank} pid {os.getpid()} " + (f"resumed at step {step}" if step else "starting fresh"), flush=True)

    while step < args.steps:
        started = time.monotonic()
        x, y = batch(step, rank, args.batch, args.width, device)
        loss = nn.functional.mse_loss(trained(x), y)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        step += 1
        if rank == 0:
            print(f"step {step} loss {loss.item():.6f}", flush=True)
        ckpt.progress(step)
        if ckpt.should_save(step):
            if args.sharded:
                model_state, optimizer_state = get_state_dict(model, optimizer)
                sharded = {"model": model_state, "optimizer": optimizer_state, "step": torch.tensor(step)}
                ckpt.save_sharded(step, sharded)
            else:
                ckpt.save(step, {"model": model.state_dict(), "optimizer": optimizer.state_dict(), "step": step})
        time.sleep(max(0.0, args.step_seconds - (time.monotonic() - started)))

    if rank == 0:
        print(f"done: {step} steps, parameters sha256 {parameters_digest(model)}", flush=True)
    if gang:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
