"""A small, honest training loop that keeps the broker's checkpoint contract.

It fits a linear model by minibatch SGD with numpy. Every node of the gang computes the same
minibatch for step ``s`` (seeded by ``s``), so all replicas hold identical weights, as they would
after an all-reduce; node 0 writes the checkpoints.

- ``BROKER_RESUME_FROM``: resume from this checkpoint (empty on the first start).
- ``BROKER_CHECKPOINT_DIR``: write checkpoints here; ``LATEST`` names the newest complete one.
- ``SIGUSR1``: checkpoint at the end of the current step, then keep training.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time
from pathlib import Path

import numpy as np

FEATURES = 32
BATCH = 256


def minibatch(step: int, true_weights: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(step)
    x = rng.normal(size=(BATCH, FEATURES))
    y = x @ true_weights + rng.normal(scale=0.1, size=BATCH)
    return x, y


def save(directory: Path, step: int, weights: np.ndarray) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"step-{step:06d}.npz"
    tmp = directory / f".step-{step:06d}.tmp.npz"
    np.savez(tmp, step=step, weights=weights)
    os.replace(tmp, path)
    marker_tmp = directory / ".LATEST.tmp"
    marker_tmp.write_text(f"{path.name}\nstep={step}\n")  # the step lets the broker count work kept
    os.replace(marker_tmp, directory / "LATEST")  # the checkpoint is complete only from here
    return path


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=400)
    parser.add_argument("--step-seconds", type=float, default=0.1, help="pace each step (stands for GPU time)")
    parser.add_argument("--checkpoint-every", type=int, default=100)
    parser.add_argument("--lr", type=float, default=0.05)
    args = parser.parse_args()

    rank = int(os.environ.get("SKYPILOT_NODE_RANK", "0"))
    nodes = int(os.environ.get("SKYPILOT_NUM_NODES", "1"))
    checkpoint_dir = Path(os.environ.get("BROKER_CHECKPOINT_DIR", "checkpoints"))
    resume_from = os.environ.get("BROKER_RESUME_FROM", "")

    true_weights = np.random.default_rng(0).normal(size=FEATURES)
    weights = np.zeros(FEATURES)
    step = 0
    if resume_from:
        state = np.load(resume_from)
        step, weights = int(state["step"]), state["weights"]
        print(f"resumed from {Path(resume_from).name} at step {step}", flush=True)
    else:
        print(f"starting fresh: rank {rank} of {nodes}, {args.steps} steps", flush=True)

    requested = False

    def on_signal(signum: int, _frame: object) -> None:
        nonlocal requested
        requested = True

    signal.signal(signal.SIGUSR1, on_signal)

    while step < args.steps:
        started = time.monotonic()
        x, y = minibatch(step, true_weights)
        gradient = 2.0 * x.T @ (x @ weights - y) / BATCH
        weights = weights - args.lr * gradient
        step += 1
        loss = float(np.mean((x @ weights - y) ** 2))
        if rank == 0:
            print(f"step {step} loss {loss:.5f}", flush=True)
            print(f"BROKER_PROGRESS step={step} total={args.steps}", flush=True)  # read by the node agent
        if rank == 0 and (requested or step % args.checkpoint_every == 0):
            path = save(checkpoint_dir, step, weights)
            print(f"checkpoint {path.name} ({'on notice' if requested else 'periodic'})", flush=True)
        requested = False
        time.sleep(max(0.0, args.step_seconds - (time.monotonic() - started)))

    error = float(np.linalg.norm(weights - true_weights))
    if rank == 0:
        save(checkpoint_dir, step, weights)
        print(f"done: {step} steps, weight error {error:.4f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
