"""What the job-side helper (``broker.job``) costs a training loop, next to the same contract written by hand.

    python benchmarks/job_helper.py [--steps 200000] [--mb 256] [--repeats 5]

Per step: ``progress`` + ``should_save`` (no save due) against a hand-written loop that checks a
signal flag and the period and prints the same ``BROKER_PROGRESS`` line, both printing to
``/dev/null``. Per checkpoint: ``TorchCheckpointer.save`` (temporary name, rename, ``LATEST`` with
step and save time, pruning) against ``torch.save`` to a temporary file, ``os.replace`` and a
marker written by hand, of a state dict of ``--mb`` MB of float32 parameters; and the restore,
``TorchCheckpointer.resume`` against ``torch.load``. Medians over ``--repeats``; the baseline is
measured in the same run, interleaved.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch

from broker.job import Checkpointer
from broker.job.pytorch import TorchCheckpointer


def per_step_helper(steps: int, every: int) -> float:
    ckpt = Checkpointer(tempfile.mkdtemp(), every_steps=every * 10**6, total_steps=steps)
    started = time.perf_counter()
    for step in range(1, steps + 1):
        ckpt.progress(step)
        if ckpt.should_save(step):
            raise AssertionError("no save is due in this measurement")
    return (time.perf_counter() - started) / steps


def per_step_by_hand(steps: int, every: int) -> float:
    asked: list[int] = []
    signal.signal(signal.SIGUSR1, lambda *_: asked.append(1))
    started = time.perf_counter()
    for step in range(1, steps + 1):
        print(f"BROKER_PROGRESS step={step} total={steps}", flush=True)
        if asked or step % (every * 10**6) == 0:
            raise AssertionError("no save is due in this measurement")
    return (time.perf_counter() - started) / steps


def save_by_hand(directory: Path, step: int, state: dict[str, torch.Tensor]) -> None:
    path = directory / f"step-{step:08d}"
    tmp = directory / f".step-{step:08d}.tmp"
    torch.save(state, tmp)
    os.replace(tmp, path)
    marker = directory / ".LATEST.tmp"
    marker.write_text(f"{path.name}\nstep={step}\n")
    os.replace(marker, directory / "LATEST")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=200_000)
    parser.add_argument("--mb", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    torch.manual_seed(0)
    state = {f"layer{i}": torch.randn(args.mb * 2**20 // 4 // 8) for i in range(8)}

    helper_step, hand_step = [], []
    with open(os.devnull, "w") as null, contextlib.redirect_stdout(null):
        for _ in range(args.repeats):
            helper_step.append(per_step_helper(args.steps, 100))
            hand_step.append(per_step_by_hand(args.steps, 100))
    signal.signal(signal.SIGUSR1, signal.SIG_DFL)

    save_helper, save_hand, load_helper, load_hand = [], [], [], []
    with tempfile.TemporaryDirectory() as root:
        helper_dir, hand_dir = Path(root) / "helper", Path(root) / "hand"
        hand_dir.mkdir()
        os.environ["BROKER_CHECKPOINT_DIR"] = str(helper_dir)
        ckpt = TorchCheckpointer(keep=1)
        for step in range(1, args.repeats + 1):
            def helper(step: int = step) -> None:
                started = time.perf_counter()
                with open(os.devnull, "w") as null, contextlib.redirect_stdout(null):
                    assert ckpt.save(step, state)  # keep=1: removes the one before, as the hand-written one does
                save_helper.append(time.perf_counter() - started)

            def by_hand(step: int = step) -> None:
                started = time.perf_counter()
                save_by_hand(hand_dir, step, state)
                (hand_dir / f"step-{step - 1:08d}").unlink(missing_ok=True)
                save_hand.append(time.perf_counter() - started)

            for save in (helper, by_hand) if step % 2 else (by_hand, helper):  # neither always goes first
                save()

            os.environ["BROKER_RESUME_FROM"] = str(helper_dir / f"step-{step:08d}")
            started = time.perf_counter()
            with open(os.devnull, "w") as null, contextlib.redirect_stderr(null):
                loaded = TorchCheckpointer(keep=1).resume()
            load_helper.append(time.perf_counter() - started)
            assert loaded is not None and torch.equal(loaded["layer0"], state["layer0"])
            started = time.perf_counter()
            torch.load(hand_dir / f"step-{step:08d}", map_location="cpu")
            load_hand.append(time.perf_counter() - started)
    signal.signal(signal.SIGUSR1, signal.SIG_DFL)

    median = statistics.median
    print(f"per step ({args.steps} steps x {args.repeats}, progress line to /dev/null, no save due):")
    print(f"  broker.job        {median(helper_step) * 1e6:8.2f} us")
    print(f"  by hand           {median(hand_step) * 1e6:8.2f} us   (baseline)")
    print(f"checkpoint of {args.mb} MB (torch.save, {args.repeats} saves, median):")
    print(f"  broker.job save   {median(save_helper):8.3f} s   ({args.mb / median(save_helper):.0f} MB/s)")
    print(f"  by hand save      {median(save_hand):8.3f} s   ({args.mb / median(save_hand):.0f} MB/s, baseline)")
    print(f"  broker.job resume {median(load_helper):8.3f} s")
    print(f"  torch.load        {median(load_hand):8.3f} s   (baseline)")


if __name__ == "__main__":
    main()
