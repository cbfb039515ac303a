"""`GET /v1/jobs` latency at 100, 1,000, 10,000 and 100,000 stored jobs, 20 concurrent clients, PostgreSQL.

    python benchmarks/list_jobs.py [--postgres URL] [--sizes 100,1000,10000,100000] [--clients 20]
                                   [--requests 400] [--broker CHECKOUT] [--httpx]

Builds a fresh PostgreSQL database (dropped afterwards) and serves the whole service API in this
process through the project's own serving helpers (``create_app`` behind ``BackgroundServer``:
uvicorn, real HTTP on a loopback port). The store grows to each size in turn; 80 % of the jobs are
one team's (the one that lists), 20 % another's. Most jobs ended (70 % succeeded, 20 % failed or
cancelled), 8 % wait and 2 % run; every job that got a cluster has its cluster, allocation, three
ledger minutes, two progress reports and two predictions, and jobs share 50 names per team, so
every summary field (cost, where, progress, prediction errors against earlier jobs) has rows to read.

At each size, ``--clients`` clients in another process (so they do not share this one's interpreter),
each one keep-alive HTTP/1.1 connection on asyncio's streams (``--httpx``: an ``httpx.AsyncClient``
each, as first written, several times the CPU per request), send ``--requests`` requests in all, a
third each of: the first page (the default 100 jobs), a page after a random job of the team (a cursor
deep in the list), and the running jobs (``state=running``).
Printed: p50, p95 and p99 per size, and two baselines measured in the same run at the same
concurrency: ``GET /v1/health`` (no database), and, in process, one page of 100 summaries read the
old way (each job's own reads, as ``GET /v1/jobs/{id}`` does) against the page read in bulk. CPU per
request, of the list and of the health requests: this serving process's, the clients' process's, and
the whole machine's (``/proc/stat``: PostgreSQL, the clients and any other work on the cores).
``--broker`` serves another checkout's broker (a baseline) with this script's load.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

TEAMS = (("nlp", 0.8), ("vision", 0.2))
NAMES = 50
EPOCH = datetime(2026, 1, 1, tzinfo=UTC)


def drive(url: str, token: str, ids: list[str], clients: int, requests: int, seed: int,
          health: bool, use_httpx: bool = False) -> dict[str, Any]:
    """The load: ``requests`` requests from ``clients`` concurrent clients (``health``: the baseline's);
    latencies in seconds, and this process's CPU time.

    Each client is one keep-alive HTTP/1.1 connection written and read with asyncio's streams, with
    no HTTP library: the clients share the server's cores, so what they spend per request is taken
    from the server (an ``httpx.AsyncClient`` per client cost several times as much)."""
    rng = random.Random(seed)
    kinds = ["first", "after", "running"]
    plan = [kinds[i % 3] for i in range(requests)]
    rng.shuffle(plan)
    queue: asyncio.Queue[str] = asyncio.Queue()
    latencies: dict[str, list[float]] = {k: [] for k in (*kinds, "health")}
    statuses: dict[int, int] = {}
    host, port = url.removeprefix("http://").rsplit(":", 1)
    head = f"Host: {host}:{port}\r\nAuthorization: Bearer {token}\r\n\r\n".encode()

    def target(kind: str) -> str:
        return {"first": "/v1/jobs", "after": f"/v1/jobs?after={rng.choice(ids)}",
                "running": "/v1/jobs?state=running", "health": "/v1/health"}[kind]

    async def client() -> None:
        if use_httpx:
            await httpx_client(url, token, queue, target, latencies, statuses)
            return
        reader, writer = await asyncio.open_connection(host, int(port))
        try:
            while not queue.empty():
                kind = queue.get_nowait()
                began = time.perf_counter()
                writer.write(f"GET {target(kind)} HTTP/1.1\r\n".encode() + head)
                lines = (await reader.readuntil(b"\r\n\r\n")).split(b"\r\n")
                length = next(int(line.split(b":", 1)[1]) for line in lines
                              if line[:15].lower() == b"content-length:")
                await reader.readexactly(length)
                latencies[kind].append(time.perf_counter() - began)
                code = int(lines[0].split(b" ", 2)[1])
                statuses[code] = statuses.get(code, 0) + 1
        finally:
            writer.close()

    async def phase(items: list[str]) -> float:
        for item in items:
            queue.put_nowait(item)
        began = time.perf_counter()
        await asyncio.gather(*(client() for _ in range(clients)))
        return time.perf_counter() - began

    cpu = time.process_time()
    seconds = asyncio.run(phase(["health"] * requests if health else plan))
    return {"latencies": latencies, "statuses": statuses, "seconds": seconds,
            "cpu_ms": (time.process_time() - cpu) * 1000 / requests}


async def httpx_client(url: str, token: str, queue: asyncio.Queue[str], target: Any, latencies: dict[str, list[float]],
                       statuses: dict[int, int]) -> None:
    """One client as the benchmark first had it (``--httpx``): an ``httpx.AsyncClient``, for comparison."""
    import httpx

    async with httpx.AsyncClient(base_url=url, timeout=120, headers={"Authorization": f"Bearer {token}"}) as http:
        while not queue.empty():
            kind = queue.get_nowait()
            began = time.perf_counter()
            response = await http.get(target(kind))
            latencies[kind].append(time.perf_counter() - began)
            statuses[response.status_code] = statuses.get(response.status_code, 0) + 1


def pct(values: list[float], q: float) -> float:
    if len(values) < 2:
        return values[0] * 1000 if values else float("nan")
    return statistics.quantiles(values, n=100, method="inclusive")[round(q * 100) - 1] * 1000


def grow(store: Any, start: int, end: int, rng: random.Random) -> None:
    """Stored jobs ``start`` .. ``end - 1``, with their clusters, allocations, ledger, progress and predictions."""
    from sqlalchemy import insert

    from broker.store.tables import AllocationRow, ClusterRow, JobRow, LedgerRow, PredictionRow, ProgressRow

    for chunk in range(start, end, 5000):
        jobs, clusters, allocations, ledger, progress, predictions = [], [], [], [], [], []
        for index in range(chunk, min(chunk + 5000, end)):
            team = "nlp" if rng.random() < TEAMS[0][1] else "vision"
            roll = rng.random()
            state = ("SUCCEEDED" if roll < 0.7 else "FAILED" if roll < 0.8 else "CANCELLED" if roll < 0.9
                     else "PENDING" if roll < 0.98 else "RUNNING")
            created = EPOCH + timedelta(seconds=index * 7)
            ended = state in ("SUCCEEDED", "FAILED", "CANCELLED")
            job_id = f"j-{index:08x}"
            jobs.append({"id": job_id, "name": f"sweep-{index % NAMES}", "team": team, "state": state,
                         "priority": 500, "spec": {}, "backend": "local", "num_nodes": 1, "gpus_per_node": 1,
                         "accelerator": "V100", "checkpoint_dir": "/ckpt", "attempt": 0 if state == "PENDING" else 1,
                         "preemptions": 0, "migrations": 0, "work_lost_s": 0.0, "zones": [],
                         "created_at": created, "updated_at": created, "work_s": 3600.0,
                         "finished_at": created + timedelta(hours=1) if ended else None,
                         "wall_started_at": created,
                         "wall_finished_at": created + timedelta(hours=1) if ended else None})
            if state == "PENDING":
                continue
            cluster_id = f"c-{index:08x}"
            clusters.append({"id": cluster_id, "launch_key": cluster_id, "job_id": job_id, "backend": "local",
                             "cloud": "aws", "region": "us-east-1", "zone": "us-east-1a", "instance_type": "p3.2xlarge",
                             "accelerator": "V100", "gpus_per_node": 1, "num_nodes": 1, "spot": True,
                             "price_per_node_hour": 0.9, "on_demand_price_per_node_hour": 3.06,
                             "state": "TERMINATED" if ended else "UP", "handle": {}, "created_at": created,
                             "up_at": created + timedelta(minutes=2)})
            allocations.append({"job_id": job_id, "cluster_id": cluster_id, "attempt": 1, "gpus": {"0": [0]},
                                "started_at": created, "running_at": created + timedelta(minutes=3),
                                "ended_at": created + timedelta(hours=1) if ended else None})
            for minute in range(3):
                ledger.append({"cluster_id": cluster_id, "minute": created + timedelta(minutes=minute),
                               "holder": f"job:{job_id}", "job_id": job_id, "team": team, "usage": "job",
                               "cloud": "aws", "region": "us-east-1", "zone": "us-east-1a",
                               "instance_type": "p3.2xlarge", "accelerator": "V100", "nodes": 1, "gpus": 1.0,
                               "seconds": 60.0, "spot": True, "price_per_node_hour": 0.9,
                               "on_demand_price_per_node_hour": 3.06, "cost": 0.015, "on_demand_cost": 0.051})
            for step in (1, 2):
                at = created + timedelta(minutes=10 * step)
                progress.append({"job_id": job_id, "attempt": 1, "step": 100 * step, "total": 1000, "at": at})
                predictions.append({"job_id": job_id, "attempt": 1, "made_at": at,
                                    "finish_at": created + timedelta(minutes=55 + step),
                                    "low_at": created + timedelta(minutes=50), "high_at": created + timedelta(hours=2),
                                    "source": "progress"})
        with store.transaction() as s:
            for table, rows in ((JobRow, jobs), (ClusterRow, clusters), (AllocationRow, allocations),
                                (LedgerRow, ledger), (ProgressRow, progress), (PredictionRow, predictions)):
                if rows:
                    s.execute(insert(table), rows)


def in_process_pages(store: Any, team: str) -> tuple[float, float, bool]:
    """Median ms of the newest page of 100 summaries read job by job (the old list) and in bulk; equal?"""
    from sqlalchemy import select

    from broker.status.orm_source import job_summary
    from broker.status.page_source import page_summaries
    from broker.store.tables import JobRow

    now = datetime.now(UTC)
    old, new = [], []
    same = True
    for _ in range(5):
        with store.transaction() as s:
            page = list(s.scalars(select(JobRow).where(JobRow.team == team)
                                  .order_by(JobRow.created_at.desc(), JobRow.id).limit(100)))
            began = time.perf_counter()
            one_by_one = [job_summary(s, job, now) for job in page]
            old.append(time.perf_counter() - began)
        with store.transaction() as s:
            page = list(s.scalars(select(JobRow).where(JobRow.team == team)
                                  .order_by(JobRow.created_at.desc(), JobRow.id).limit(100)))
            began = time.perf_counter()
            bulk = page_summaries(s, page, now)
            new.append(time.perf_counter() - began)
        same = same and bulk == one_by_one
    return statistics.median(old) * 1000, statistics.median(new) * 1000, same


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--postgres", default=os.environ.get("BROKER_TEST_POSTGRES",
                                                             "postgresql://postgres@127.0.0.1:5432/postgres"))
    parser.add_argument("--sizes", default="100,1000,10000,100000")
    parser.add_argument("--clients", type=int, default=20)
    parser.add_argument("--requests", type=int, default=400)
    parser.add_argument("--broker", type=Path, help="serve the broker of this checkout instead (a baseline)")
    parser.add_argument("--httpx", action="store_true", help="the clients as first written: httpx.AsyncClient")
    parser.add_argument("--drive", help=argparse.SUPPRESS)  # the client process: a JSON job
    args = parser.parse_args()
    if args.drive:
        job = json.loads(Path(args.drive).read_text())
        print(json.dumps(drive(**job)))
        return
    if args.broker:
        sys.path.insert(0, str(args.broker.resolve()))

    import psycopg
    from sqlalchemy import select

    from broker.api.app import BackgroundServer, create_app
    from broker.clock import WallClock
    from broker.intake import Intake
    from broker.store import open_store
    from broker.store.tables import JobRow
    from broker.tokens import create_api_token

    sizes = [int(size) for size in args.sizes.split(",")]
    name = f"broker_list_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(args.postgres, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    db_url = f"{args.postgres.rsplit('/', 1)[0]}/{name}"
    home = Path(tempfile.mkdtemp(prefix="broker-list-"))
    server: BackgroundServer | None = None
    try:
        store = open_store(db_url)
        token = create_api_token(store, "nlp").token
        app = create_app(store, WallClock(), Intake(home, "local", frozenset({("V100", 1)})))
        server = BackgroundServer(app).start()
        while not server.server.started:
            time.sleep(0.05)
        rng = random.Random(7)
        stored = 0
        print(f"GET /v1/jobs, in-process uvicorn (create_app + BackgroundServer), PostgreSQL; {args.clients} "
              f"clients ({'httpx' if args.httpx else 'asyncio streams'}) in another process, {args.requests} "
              f"requests per size; broker of {Path(sys.modules['broker'].__file__ or '').parents[1]}; "
              f"load {_load()}")
        print(f"{'stored':>8} {'team':>7} {'req/s':>6} {'p50 ms':>7} {'p95 ms':>7} {'p99 ms':>7} "
              f"{'first p99':>9} {'after p99':>9} {'state p99':>9} | {'health p99':>10} | "
              f"{'page old ms':>11} {'bulk ms':>7} same | {'cpu ms/req: serve':>17} {'clients':>7} {'machine':>7} "
              f"{'health serve':>12} {'clients':>7}  statuses  load")
        for size in sizes:
            began = time.perf_counter()
            grow(store, stored, size, rng)
            stored = size
            with store.transaction() as s:
                s.execute(__import__("sqlalchemy").text("ANALYZE"))
                ids = list(s.scalars(select(JobRow.id).where(JobRow.team == "nlp")))
            filled = time.perf_counter() - began
            runs = {}
            for health in (True, False):
                spec = home / "drive.json"
                spec.write_text(json.dumps({"url": server.url, "token": token, "ids": ids, "clients": args.clients,
                                            "requests": args.requests, "seed": size, "health": health,
                                            "use_httpx": args.httpx}))
                cpu, machine = time.process_time(), _machine_cpu()  # this process serves; the machine: all
                ran = subprocess.run([sys.executable, __file__, "--drive", str(spec)], capture_output=True,
                                     text=True, check=True)
                runs[health] = {**json.loads(ran.stdout),
                                "serve_ms": (time.process_time() - cpu) * 1000 / args.requests,
                                "machine_ms": (_machine_cpu() - machine) * 1000 / args.requests}
            result, lat = runs[False], {**runs[False]["latencies"], "health": runs[True]["latencies"]["health"]}
            every = lat["first"] + lat["after"] + lat["running"]
            old, bulk, same = in_process_pages(store, "nlp")
            print(f"{size:>8} {len(ids):>7} {len(every) / result['seconds']:>6.0f} {pct(every, 0.5):>7.1f} "
                  f"{pct(every, 0.95):>7.1f} {pct(every, 0.99):>7.1f} {pct(lat['first'], 0.99):>9.1f} "
                  f"{pct(lat['after'], 0.99):>9.1f} {pct(lat['running'], 0.99):>9.1f} | "
                  f"{pct(lat['health'], 0.99):>10.1f} | {old:>11.1f} {bulk:>7.1f} {same!s:<5}| "
                  f"{result['serve_ms']:>17.1f} "
                  f"{result['cpu_ms']:>7.1f} {result['machine_ms']:>7.1f} {runs[True]['serve_ms']:>12.1f} "
                  f"{runs[True]['cpu_ms']:>7.1f}  "
                  f"{result['statuses']}  {_load()} (filled in {filled:.0f} s)", flush=True)
        store.dispose()
    finally:
        if server is not None:
            server.stop()
        with psycopg.connect(args.postgres, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def _machine_cpu() -> float:
    """Seconds of CPU the whole machine has spent (every process: this one, PostgreSQL, the clients, and
    any other work on it), from ``/proc/stat``."""
    fields = Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]
    busy = sum(int(f) for f in fields[:8]) - int(fields[3]) - int(fields[4])  # less idle and iowait
    return busy / os.sysconf("SC_CLK_TCK")


def _load() -> str:
    return Path("/proc/loadavg").read_text().split(" ", 1)[0]


if __name__ == "__main__":
    main()
