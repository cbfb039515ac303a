"""A job that keeps its GPU busy for half its time and sleeps on the CPU for the other half.

Blocks of ``--block`` seconds, alternately: matrix products on the GPU (synchronised, so the GPU is
busy the whole block), then ``time.sleep`` (the GPU idle, as under a starved input pipeline or an
evaluation on the CPU). One step a second, reported as progress; the first report comes as soon as
CUDA is ready, so start-up is short. At the end it prints the seconds it spent in each.

    python examples/gpu/half_idle.py [--minutes 8] [--block 120] [--device cuda] [--size 4096]
"""

from __future__ import annotations

import argparse
import time

import torch


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--minutes", type=float, default=8.0)
    parser.add_argument("--block", type=float, default=120.0, help="seconds of each busy or idle block")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--size", type=int, default=4096, help="side of the matrices multiplied")
    args = parser.parse_args()
    device = torch.device(args.device)
    a = torch.randn(args.size, args.size, device=device)
    b = torch.randn(args.size, args.size, device=device) / args.size**0.5
    total = int(args.minutes * 60)
    per_block = max(int(args.block), 1)
    print(f"BROKER_PROGRESS step=0 total={total}", flush=True)
    busy_s = idle_s = 0.0
    for step in range(total):
        start = time.monotonic()
        end = start + 1.0
        if (step // per_block) % 2 == 0:
            while time.monotonic() < end:
                a = torch.tanh(a @ b)
                if device.type == "cuda":
                    torch.cuda.synchronize()
            busy_s += time.monotonic() - start
        else:
            time.sleep(max(end - time.monotonic(), 0.0))
            idle_s += time.monotonic() - start
        print(f"BROKER_PROGRESS step={step + 1} total={total}", flush=True)
    print(f"busy {busy_s:.0f} s, idle {idle_s:.0f} s", flush=True)


if __name__ == "__main__":
    main()
