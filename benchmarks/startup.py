"""How long `broker` takes to answer: each command in fresh processes, against `python -c pass`.

Every figure is the median wall time of N fresh processes (default 10) of the installed `broker`
script, run from compiled bytecode as an installed CLI runs (after one untimed run), measured in
the same run as the interpreter's own start-up (`python -c pass`), which is printed first as the
baseline; the CPU seconds (user + system) of each process are printed too, since on a shared machine
wall time mostly measures the others' load. Commands:

- `broker --help` and `broker COMMAND --help` for the main commands;
- `broker status` on the embedded store (a SQLite store in a fresh broker home, migrated once first),
  and again on the store the launches below leave (their jobs finished);
- `broker status --server URL` against a real `broker serve` started here on a free port;
- `broker launch JOB --backend local --detach` (a one-line job), fewer times (default 3): it reads
  the job file (by SkyPilot's schema and the built-in catalog: the local backend does not import
  SkyPilot), stores the job and starts the engine in the background.

Then refusals that need no data (exit 2): `prices --cloud aws,ibm`, `report --since 3x`, `serve --backend
nope`, a job file the broker refuses by itself (a bad `broker.deadline`) and one only SkyPilot's schema
refuses (an unknown top-level key).

Targets (issue "A CLI that feels instant"): help < 0.3 s, status < 0.8 s, status --server < 0.5 s; (issue "A
dashboard and a CLI a platform engineer keeps open all day") a refused argument or job file < 0.5 s,
`launch --detach` on the embedded default < 2 s.

    python benchmarks/startup.py [--runs 10] [--launch-runs 3] [--before OTHER_CHECKOUT/.venv/bin/broker]
"""

from __future__ import annotations

import argparse
import os
import resource
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
BROKER = str(BIN / "broker") if (BIN / "broker").exists() else None
TARGETS = {"help": 0.3, "status": 0.8, "status --server": 0.5, "refused": 0.5, "detach": 2.0}
BAD_BROKER_SECTION = """name: refused-probe
resources:
  accelerators: V100:1
run: echo done
broker:
  deadline: yesterday-ish
"""
UNKNOWN_KEY = """name: refused-probe
resources:
  accelerators: V100:1
run: echo done
not_a_skypilot_key: 1
"""
JOB = """name: startup-probe
resources:
  accelerators: V100:1
run: echo done
"""


def broker_command(*args: str) -> list[str]:
    return [BROKER, *args] if BROKER else [sys.executable, "-m", "broker", *args]


CPU: dict[int, list[float]] = {}  # id(times) -> CPU seconds (user + system) of each run's process


def timed(command: Sequence[str], env: dict[str, str], runs: int, expect: int = 0, warm: bool = True) -> list[float]:
    """``runs`` timed runs, after one untimed run (``warm``) that leaves the modules it imports compiled."""
    times: list[float] = []
    cpu = CPU.setdefault(id(times), [])
    if warm:
        subprocess.run(list(command), env=env, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                       timeout=300)
    for _ in range(runs):
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        started = time.perf_counter()
        done = subprocess.run(list(command), env=env, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                              timeout=300)
        times.append(time.perf_counter() - started)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpu.append(after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime)
        if done.returncode != expect:
            raise SystemExit(f"{' '.join(command)} failed ({done.returncode}): {done.stderr.decode()[-1500:]}")
    return times


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_for(url: str, timeout: float = 90.0) -> None:
    import urllib.request

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(url + "/v1/health", timeout=2):
                return
        except OSError:
            time.sleep(0.3)
    raise SystemExit(f"broker serve did not answer at {url} within {timeout:.0f} s")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--launch-runs", type=int, default=3)
    parser.add_argument("--before", metavar="BROKER", help="another `broker` executable (an earlier checkout's): "
                                                            "its refusals are timed in the same run, beside these")
    args = parser.parse_args()
    rows: list[tuple[str, list[float], str]] = []

    with tempfile.TemporaryDirectory() as tmp:
        home = Path(tmp) / "home"
        # As an installed CLI runs: from compiled bytecode. A shell with PYTHONDONTWRITEBYTECODE (and a checkout
        # without __pycache__) would otherwise compile every module of the broker's on every run, in every
        # figure; the bytecode goes to a folder of its own here, so no checkout is written to.
        env = {**os.environ, "BROKER_HOME": str(home), "NO_COLOR": "1", "PYTHONPYCACHEPREFIX": str(Path(tmp) / "pyc")}
        env.pop("BROKER_SERVER", None)
        env.pop("PYTHONDONTWRITEBYTECODE", None)
        code_root = subprocess.run([sys.executable, "-c", "import broker, pathlib; print(pathlib.Path(broker.__file__)"
                                    ".resolve().parents[1])"], env=env, capture_output=True, text=True,
                                   check=True).stdout.strip()  # the checkout whose `broker` is timed
        subprocess.run([sys.executable, "-m", "compileall", "-q", "broker", "providers", "policies"], env=env,
                       cwd=code_root, stdout=subprocess.DEVNULL, check=True)
        rows.append(("python -c pass (baseline)", timed([sys.executable, "-c", "pass"], env, args.runs), ""))
        # The floor of any command that opens a store: importing SQLAlchemy's ORM and its SQLite dialect.
        rows.append(("python -c 'import sqlalchemy.orm' (store floor)",
                     timed([sys.executable, "-c", "import sqlalchemy.orm, sqlalchemy.dialects.sqlite"], env,
                           args.runs), ""))
        rows.append(("broker --help", timed(broker_command("--help"), env, args.runs), "help"))
        for command in ("launch", "status", "prices", "report"):
            rows.append((f"broker {command} --help", timed(broker_command(command, "--help"), env, args.runs), "help"))
        refusals = Path(tmp) / "refusals"
        refusals.mkdir()
        (refusals / "bad-broker.yaml").write_text(BAD_BROKER_SECTION)
        (refusals / "unknown-key.yaml").write_text(UNKNOWN_KEY)
        for name, argv in (("broker prices --cloud aws,ibm", ["prices", "--cloud", "aws,ibm"]),
                           ("broker report --since 3x", ["report", "--since", "3x"]),
                           ("broker serve --backend nope", ["serve", "--backend", "nope"]),
                           ("broker launch (bad broker: section)", ["launch", str(refusals / "bad-broker.yaml")]),
                           ("broker launch (key SkyPilot refuses)", ["launch", str(refusals / "unknown-key.yaml")])):
            rows.append((name, timed(broker_command(*argv), env, args.runs, expect=2), "refused"))
            if args.before:
                rows.append((f"  before: {name.removeprefix('broker ')}", timed([args.before, *argv], env, args.runs,
                                                                                 expect=2), ""))
        timed(broker_command("status"), env, 1)  # creates and migrates the store once
        rows.append(("broker status (embedded SQLite)", timed(broker_command("status"), env, args.runs), "status"))

        port = free_port()
        url = f"http://127.0.0.1:{port}"
        serve = subprocess.Popen(broker_command("serve", "--port", str(port)), env=env, cwd=ROOT,
                                 stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            wait_for(url)
            token = subprocess.run(broker_command("token", "create", "--team", "bench"), env=env, cwd=ROOT,
                                   capture_output=True, text=True, check=True).stdout.strip()
            served = {**env, "BROKER_TOKEN": token}
            rows.append(("broker status --server (broker serve)",
                         timed(broker_command("status", "--server", url), served, args.runs), "status --server"))
        finally:
            serve.terminate()
            serve.wait(timeout=60)

        job = Path(tmp) / "probe.yaml"
        job.write_text(JOB)
        launch_home = Path(tmp) / "launch-home"
        launch_env = {**env, "BROKER_HOME": str(launch_home)}
        if args.launch_runs > 0:
            rows.append(("broker launch --backend local --detach (offline)",
                         timed(broker_command("launch", str(job), "--backend", "local", "--detach"), launch_env,
                               args.launch_runs, warm=False), "detach"))
            # Let the detached engine finish the one-line jobs before the home is removed.
            deadline = time.monotonic() + 180
            while time.monotonic() < deadline:
                listed = subprocess.run(broker_command("status", "--json"), env=launch_env, cwd=ROOT,
                                        capture_output=True, text=True)
                if all(s not in listed.stdout for s in ("PENDING", "PROVISIONING", "RUNNING")):
                    break
                time.sleep(2)
            # The same command on a store with jobs: a summary per job (ledger, clusters, predictions).
            rows.append((f"broker status (embedded, {args.launch_runs} finished jobs)",
                         timed(broker_command("status"), launch_env, args.runs), "status"))

    baseline = statistics.median(rows[0][1])
    base_cpu = statistics.median(CPU[id(rows[0][1])])
    print(f"{'command':<52} {'runs':>4} {'median s':>9} {'min s':>7} {'x baseline':>10} {'CPU s':>7} "
          f"{'CPU x base':>10}  target (median wall; median CPU)")
    for name, times, target in rows:
        median = statistics.median(times)
        cpu = statistics.median(CPU[id(times)])
        goal = TARGETS.get(target)
        verdict = "" if goal is None else (f"< {goal} s: wall {'met' if median < goal else 'MISSED'}, "
                                           f"CPU {'met' if cpu < goal else 'MISSED'}")
        print(f"{name:<52} {len(times):>4} {median:>9.3f} {min(times):>7.3f} {median / baseline:>10.1f} "
              f"{cpu:>7.3f} {cpu / base_cpu:>10.1f}  {verdict}")
    print("from compiled bytecode (PYTHONPYCACHEPREFIX; one untimed run of each command first, but of launch)")
    print(f"python {sys.version.split()[0]}, {os.cpu_count()} CPU(s), load average "
          f"{', '.join(f'{x:.2f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
