"""Notice to signal: from a preemption notice being readable on the node to the job's signal handler.

    python benchmarks/notices.py [--notices 50] [--seed 0]

For each cloud's metadata stand-in (EC2 IMDSv2, GCE's metadata server with ``wait_for_change``,
Azure Scheduled Events; the same ones the tests use), the node agent runs a job ``--notices``
times. Once the job's handler is in place the notice is set after a random 0-1 s (so it falls
anywhere between two reads), and the job writes the wall time its handler ran. Printed per cloud:
p50, p95 and max of (handler time - time the notice was set), for the agent's notice reading now
(each cloud's ``NOTICE_POLL_SECONDS``) and, as the baseline in the same run, the agent as it was:
the notice read once per ``--poll``, 1 s by default. The agent runs in this process (its job is a
separate process), as ``python -m broker.agent`` runs it on a node.
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from datetime import UTC, datetime, timedelta
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from broker.agent.node import AgentOptions, run_agent
from providers.node_notice import NOTICE_POLL_SECONDS
from tests.cloud_metadata import (
    FakeAzureImds,
    FakeGce,
    FakeImds,
    azure_server,
    gce_server,
    imds_server,
)

JOB = """
import os, signal, sys, time
from pathlib import Path
d = Path(os.environ["BROKER_CHECKPOINT_DIR"])
def handler(*_):
    (d / "heard").write_text(repr(time.time()))
    (d / "ckpt").write_text("x")
    (d / "LATEST").write_text("ckpt")
    sys.exit(0)
signal.signal(signal.SIGUSR1, handler)
(d / "ready").write_text("")
time.sleep(60)
"""
BASELINE_POLL_S = 1.0  # the agent's --poll default, at which it read notices before


class Cloud:
    """One metadata stand-in and how to raise and clear its notice."""

    def __init__(self, name: str, server: Callable[[], AbstractContextManager[str]], notify: Callable[[], None],
                 clear: Callable[[], None]) -> None:
        self.name, self.server, self.notify, self.clear = name, server, notify, clear


def clouds() -> Iterator[Cloud]:
    imds = FakeImds()
    yield Cloud("aws", lambda: imds_server(imds), lambda: setattr(imds, "action", {
        "action": "terminate", "time": (datetime.now(UTC) + timedelta(seconds=120)).strftime("%Y-%m-%dT%H:%M:%SZ")}),
        lambda: setattr(imds, "action", None))
    gce = FakeGce()
    yield Cloud("gcp", lambda: gce_server(gce), lambda: gce.set("preempted", "TRUE"),
                lambda: gce.set("preempted", "FALSE"))
    azure = FakeAzureImds()
    yield Cloud("azure", lambda: azure_server(azure), lambda: azure.preempt([azure.vm_name]),
                lambda: azure.events.clear())


def one_notice(cloud: Cloud, url: str, job: Path, folder: Path, notice_poll: float | None, poll: float,
               delay: float) -> float | None:
    """Seconds from the notice being set to the job's handler running; None if it never ran."""
    folder.mkdir()
    set_at: list[float] = []

    def raise_notice() -> None:
        until = time.monotonic() + 30
        while not (folder / "ready").exists() and time.monotonic() < until:
            time.sleep(0.005)
        time.sleep(delay)
        set_at.append(time.time())
        cloud.notify()

    cloud.clear()
    thread = threading.Thread(target=raise_notice, daemon=True)
    thread.start()
    run_agent(AgentOptions(command=[sys.executable, str(job)], cloud=cloud.name, metadata_url=url,
                           poll_seconds=poll, notice_poll_seconds=notice_poll, checkpoint_dir=str(folder),
                           env={"BROKER_CHECKPOINT_DIR": str(folder)}))
    thread.join(timeout=5)
    heard = folder / "heard"
    if not set_at or not heard.exists():
        return None
    return float(heard.read_text()) - set_at[0]


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--notices", type=int, default=50, help="notices per cloud and setting (1-1000)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    if not 1 <= args.notices <= 1000:
        parser.error(f"--notices: expected 1 to 1000, got {args.notices}")
    import logging

    logging.disable(logging.WARNING)
    rng = random.Random(args.seed)
    print(f"notice readable -> job's handler, {args.notices} notices per cloud and setting (seed {args.seed})")
    print(f"{'cloud':6s} {'setting':34s} {'p50 s':>7s} {'p95 s':>7s} {'max s':>7s} {'missed':>6s}")
    with tempfile.TemporaryDirectory() as tmp:
        job = Path(tmp) / "job.py"
        job.write_text(JOB)
        for cloud in clouds():
            with cloud.server() as url:
                for label, notice_poll, poll in (
                        (f"now (read every {NOTICE_POLL_SECONDS[cloud.name] * 1000:.0f} ms)", None, BASELINE_POLL_S),
                        (f"baseline (read every --poll, {BASELINE_POLL_S:g} s)", BASELINE_POLL_S, BASELINE_POLL_S)):
                    delays = [rng.uniform(0, 1) for _ in range(args.notices)]
                    found = [one_notice(cloud, url, job, Path(tmp) / f"{cloud.name}-{label[:3]}-{i}", notice_poll,
                                        poll, d) for i, d in enumerate(delays)]
                    heard = [x for x in found if x is not None]
                    missed = len(found) - len(heard)
                    if heard:
                        print(f"{cloud.name:6s} {label:34s} {statistics.median(heard):7.3f} "
                              f"{percentile(heard, 0.95):7.3f} {max(heard):7.3f} {missed:6d}", flush=True)
                    else:
                        print(f"{cloud.name:6s} {label:34s} {'-':>7s} {'-':>7s} {'-':>7s} {missed:6d}", flush=True)


if __name__ == "__main__":
    main()
