"""The CPU an idle ``broker serve`` leader uses with a long queue that certainly waits.

    python benchmarks/idle_service.py [--pending 1000] [--running 1] [--seconds 30]

Builds the service of ``broker serve`` in-process on a fresh broker home (local backend, SQLite),
with ``--running`` jobs started for real (a local cluster each, the pool capped at their GPUs) and
``--pending`` more queued behind the cap, and makes it the leader: its scheduler ticks every
``poll_seconds`` (0.2 s). Once the queue has had its first look and nothing moves, it measures the
CPU the process uses (``time.process_time``: every thread of the service; the clusters' own host and
agent processes are not the service's) over ``--seconds``:

- ``gated``: the engine steps when something happened or is due, and the store is read only after this
  process wrote, while something is in flight or due, or every ``REMOTE_S`` (``broker.service.wake``);
- ``read a tick`` (baseline, same run, same service): gated, but the store read on every tick;
- ``stored tick`` (baseline, same run, same service): gated, but the tick kept with the other jobs in
  the store's APScheduler schedule, as before ``broker.service.runner.build_ticker``;
- ``every tick`` (baseline, same run, same service): the gate removed, a step on every tick.
"""

from __future__ import annotations

import argparse
import logging
import sys
import tempfile
import threading
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from sqlalchemy import event  # noqa: E402

from broker.config.settings import load_settings  # noqa: E402
from broker.engine import machine  # noqa: E402
from broker.model import JobState  # noqa: E402
from broker.service import tasks  # noqa: E402
from broker.service.runner import Service  # noqa: E402
from broker.spec.job import parse_job_spec  # noqa: E402
from broker.store.tables import JobRow  # noqa: E402
from providers.base import SpotQuote  # noqa: E402
from providers.trace import write_trace  # noqa: E402

JOB = "name: {name}\nresources:\n  accelerators: V100:4\nrun: sleep 100000\n"


def counts(service: Service) -> dict[str, int]:
    from sqlalchemy import func, select

    with service.runtime.store.transaction() as s:
        return {state: n for state, n in s.execute(select(JobRow.state, func.count()).group_by(JobRow.state))}


def cpu_share(seconds: float) -> float:
    started_cpu, started = time.process_time(), time.perf_counter()
    time.sleep(seconds)
    return (time.process_time() - started_cpu) / (time.perf_counter() - started)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pending", type=int, default=1000)
    parser.add_argument("--running", type=int, default=1)
    parser.add_argument("--seconds", type=float, default=30.0)
    args = parser.parse_args()
    logging.getLogger("broker").setLevel(logging.WARNING)
    logging.getLogger("apscheduler").setLevel(logging.WARNING)
    with tempfile.TemporaryDirectory(prefix="idle-service-") as tmp:
        home = Path(tmp) / "home"
        home.mkdir()
        origin = datetime(2026, 1, 1, tzinfo=UTC)
        trace = home / "market.csv"
        write_trace(trace, [SpotQuote("aws", "us-east-1", "us-east-1a", "p3.8xlarge", "V100", 4, 3.67, 12.24,
                                      origin + timedelta(minutes=m), available_nodes=args.running + 2)
                            for m in range(24 * 60)])
        # A long lease: on a loaded machine a starved renewal must not fence the leader mid-measurement.
        settings = load_settings(home=home, market=trace, speed=1.0, local_provision_seconds=2.0,
                                 max_gpus=4 * args.running, serve_port=0, pool_idle_seconds=0.0,
                                 leader_check_seconds=20.0)
        service = Service(settings)
        try:
            for i in range(args.running + args.pending):
                service.runtime.submit(parse_job_spec(JOB.format(name=f"j{i}"), source=str(home / "j.yaml")))
            service._campaign()  # lead: the scheduler starts stepping the engine
            assert service.leading
            threading.Thread(target=service._renew, daemon=True, name="lease").start()
            deadline = time.time() + 600
            while counts(service).get(JobState.RUNNING.value, 0) < args.running:
                if time.time() > deadline:
                    raise SystemExit(f"the running jobs did not start: {counts(service)}")
                time.sleep(0.5)
            time.sleep(10.0)  # the queue's first look, then nothing moves
            print(f"{args.pending} pending, {args.running} running, poll_seconds {settings.poll_seconds}: "
                  f"{counts(service)}")
            steps = [0, 0.0]  # engine steps, and their CPU seconds (the thread's that stepped)
            engine = service.engine
            assert engine is not None
            step = engine.step

            def timed_step() -> None:
                began = time.thread_time()
                try:
                    step()
                finally:
                    steps[0] += 1
                    steps[1] += time.thread_time() - began

            engine.step = timed_step  # type: ignore[method-assign]

            def of_steps(seconds: float) -> str:
                done, spent = steps
                steps[:] = [0, 0.0]
                return f"; {done} engine steps, {100 * spent / seconds:.1f} % of a core in them"

            statements = [0]
            event.listen(service.runtime.store.engine, "before_cursor_execute",
                         lambda *_: statements.__setitem__(0, statements[0] + 1))
            steps[:] = [0, 0.0]
            print(f"load average {Path('/proc/loadavg').read_text().split(' ', 1)[0]}", flush=True)
            gated = cpu_share(args.seconds)
            print(f"gated       CPU {100 * gated:5.1f} % of one core over {args.seconds:.0f} s, "
                  f"{statements[0]} statements{of_steps(args.seconds)}", flush=True)
            # Before: the gate read the store on every tick (no wake on this process's writes).
            assert service.step_gate is not None
            wake, service.step_gate.wake = service.step_gate.wake, None
            statements[0] = 0
            every_read = cpu_share(args.seconds)
            print(f"read a tick CPU {100 * every_read:5.1f} % of one core over {args.seconds:.0f} s, "
                  f"{statements[0]} statements{of_steps(args.seconds)} (baseline: gated, the store read every "
                  f"tick)", flush=True)
            service.step_gate.wake = wake
            # Before: the tick kept with the other jobs in the store's schedule (read and rewritten every tick).
            service.ticker.pause()
            service.scheduler.add_job(tasks.engine_step, "interval", seconds=settings.poll_seconds,
                                      id="engine-step-stored", name="engine-step-stored")
            statements[0] = 0
            stored = cpu_share(args.seconds)
            print(f"stored tick CPU {100 * stored:5.1f} % of one core over {args.seconds:.0f} s, "
                  f"{statements[0]} statements{of_steps(args.seconds)} (baseline: the tick in the store's "
                  f"schedule, gated)", flush=True)
            service.scheduler.remove_job("engine-step-stored")
            service.ticker.resume()
            gate, service.step_gate = service.step_gate, None
            statements[0] = 0
            every = cpu_share(args.seconds)
            print(f"every tick  CPU {100 * every:5.1f} % of one core over {args.seconds:.0f} s, "
                  f"{statements[0]} statements{of_steps(args.seconds)} (baseline)", flush=True)
            service.step_gate = gate
            print(f"load average {Path('/proc/loadavg').read_text().split(' ', 1)[0]}", flush=True)
            if not service.confirm_leadership():
                raise SystemExit("the leader lost its lease during the measurement: the figures are void")
        finally:
            service._stop.set()  # the lease's renewal ends
            service.lock.close()
            service._stop_scheduler()
            tasks.drain(10.0)
            tasks.bind(None)
            engine = service.runtime.engine(None)  # unfenced: tear down what the leader started
            for job_id in engine.active_jobs():
                machine.cancel_job(service.runtime.store, job_id, service.runtime.clock)
            for _ in range(3):
                engine.step()
            service.runtime.store.dispose()
            service.socket.close()


if __name__ == "__main__":
    main()
