"""Dollars per finished job on the live engine: the quickstart, end to end, under each selection policy.

Every run is a real `broker launch examples/quickstart.yaml` on the local backend (2 nodes, a numpy
training job, the bundled market in which the cheapest zone loses its capacity twenty minutes in),
each in a fresh broker home, one policy at a time. Printed: wall time, cost, cost relative to the
`on_demand` policy measured in the same run, preemptions, migrations and work lost.

    python benchmarks/quickstart.py [--policies broker,up_multi,skypilot_eager,cheapest_spot,on_demand]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
POLICIES = "broker,up_multi,skypilot_eager,cheapest_spot,on_demand"


def run(policy: str) -> dict[str, object]:
    with tempfile.TemporaryDirectory() as home:
        env = {**os.environ, "BROKER_HOME": home, "BROKER_SELECTION_POLICY": policy}
        started = time.monotonic()
        result = subprocess.run([sys.executable, "-m", "broker", "launch", "examples/quickstart.yaml", "--json"],
                                cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
        elapsed = time.monotonic() - started
    if result.returncode != 0:
        raise SystemExit(f"{policy}: launch failed ({result.returncode}): {result.stderr[-2000:]}")
    summary: dict[str, object] = json.loads(result.stdout.strip().splitlines()[-1])
    summary["command_seconds"] = elapsed
    return summary


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--policies", default=POLICIES)
    args = parser.parse_args()
    policies = [p.strip() for p in args.policies.split(",") if p.strip()]
    results = {p: run(p) for p in policies}
    baseline = results.get("on_demand")
    print(f"{'policy':16} {'state':10} {'wall s':>7} {'cost $':>8} {'vs on_demand':>13} {'preempt':>8} "
          f"{'migr':>5} {'lost s':>7}  zones")
    for name, r in results.items():
        ratio = f"{float(r['cost']) / float(baseline['cost']):.3f}" if baseline else "-"  # type: ignore[arg-type]
        print(f"{name:16} {r['state']!s:10} {float(r['command_seconds']):7.1f} {float(r['cost']):8.4f} "  # type: ignore[arg-type]
              f"{ratio:>13} {r['preemptions']!s:>8} {r['migrations']!s:>5} {float(r['work_lost_seconds']):7.0f}  "  # type: ignore[arg-type]
              f"{' -> '.join(r['zones'])}")  # type: ignore[arg-type]


if __name__ == "__main__":
    main()
