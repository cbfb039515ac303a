"""Load on one `broker serve` over PostgreSQL: job submissions and agent notices, with duplicates.

    python benchmarks/serve_load.py [--postgres URL] [--jobs 1000] [--notices 10000] [--clients 50]

Starts one real `broker serve` process on a fresh PostgreSQL database, then, from 50 concurrent
clients: submits 1,000 jobs, and posts 10,000 preemption notices from 400 clusters' agents (each
(cluster, kind) notice posted several times by different nodes, as agents and retries do). The
local backend's engine is set not to step during the run (BROKER_POLL_SECONDS=86400), so every job
stays PENDING and the figures are those of the API and the store alone; job files are checked
against the built-in GPU catalog (BROKER_OFFLINE_CATALOG=true), since SkyPilot's catalog, when it
cannot be downloaded, is retried on every validation. Baseline: GET /v1/health
(no database) at the same concurrency, measured in the same run. It checks that every job and
every distinct notice was recorded exactly once and that duplicates were answered as such.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import secrets
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import httpx
import psycopg

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from broker.store import open_store  # noqa: E402
from broker.store.tables import ClusterRow, JobRow, NoticeRow  # noqa: E402
from broker.tokens import create_api_token, token_digest  # noqa: E402

JOB = """\
name: load-{index}
num_nodes: 1
resources:
  accelerators: V100:1
run: python train.py
broker:
  priority: {priority}
"""
KINDS = ("terminate", "rebalance", "stop", "hibernate", "maintenance")


@dataclass
class Phase:
    name: str
    requests: int
    seconds: float
    latencies: list[float]
    statuses: dict[int, int]

    @property
    def rate(self) -> float:
        return self.requests / self.seconds

    def pct(self, q: float) -> float:
        return statistics.quantiles(self.latencies, n=1000)[int(q * 1000) - 1] * 1000


async def run_phase(name: str, url: str, clients: int, calls: list[Callable[[httpx.AsyncClient], Awaitable[int]]]
                    ) -> Phase:
    queue: asyncio.Queue[Callable[[httpx.AsyncClient], Awaitable[int]]] = asyncio.Queue()
    for call in calls:
        queue.put_nowait(call)
    latencies: list[float] = []
    statuses: dict[int, int] = {}

    async def client() -> None:
        async with httpx.AsyncClient(base_url=url, timeout=60) as http:
            while not queue.empty():
                call = queue.get_nowait()
                began = time.perf_counter()
                status = await call(http)
                latencies.append(time.perf_counter() - began)
                statuses[status] = statuses.get(status, 0) + 1

    began = time.perf_counter()
    await asyncio.gather(*(client() for _ in range(clients)))
    return Phase(name, len(calls), time.perf_counter() - began, latencies, statuses)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--postgres", default=os.environ.get("BROKER_TEST_POSTGRES",
                                                             "postgresql://postgres@127.0.0.1:5432/postgres"))
    parser.add_argument("--jobs", type=int, default=1000)
    parser.add_argument("--notices", type=int, default=10000)
    parser.add_argument("--clusters", type=int, default=400)
    parser.add_argument("--clients", type=int, default=50)
    args = parser.parse_args()

    name = f"broker_load_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(args.postgres, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    db_url = f"{args.postgres.rsplit('/', 1)[0]}/{name}"
    home = Path(tempfile.mkdtemp(prefix="broker-load-"))
    server: subprocess.Popen[bytes] | None = None
    try:
        store = open_store(db_url)
        teams = {team: create_api_token(store, team).token for team in ("nlp", "vision", "speech", "rl", "infra")}
        agent_tokens = {f"c{i:04d}": secrets.token_hex(16) for i in range(args.clusters)}
        now = datetime.now(UTC)
        with store.transaction() as s:
            s.add(JobRow(id="j-agents", name="agents", team="infra", state="RUNNING", priority=500, spec={},
                         backend="local", num_nodes=1, gpus_per_node=1, checkpoint_dir="/c", created_at=now,
                         updated_at=now, zones=[]))
            s.flush()
            for cluster_id, token in agent_tokens.items():
                s.add(ClusterRow(id=cluster_id, launch_key=cluster_id, job_id="j-agents", backend="local",
                                 cloud="aws", region="us-east-1", zone="us-east-1a", instance_type="p3.2xlarge",
                                 gpus_per_node=1, num_nodes=4, spot=True, price_per_node_hour=0.9,
                                 on_demand_price_per_node_hour=3.06, state="UP", token_hash=token_digest(token),
                                 handle={}, created_at=now))

        port = free_port()
        env = {**os.environ, "BROKER_HOME": str(home), "BROKER_DB_URL": db_url, "BROKER_POLL_SECONDS": "86400",
               "BROKER_RECONCILE_SECONDS": "86400", "BROKER_OFFLINE_CATALOG": "true"}
        log = (home / "serve.log").open("wb")
        server = subprocess.Popen([sys.executable, "-m", "broker", "serve", "--port", str(port)], cwd=ROOT, env=env,
                                  stdout=log, stderr=log)
        url = f"http://127.0.0.1:{port}"
        deadline = time.time() + 60
        while True:
            try:
                if httpx.get(f"{url}/v1/health", timeout=2).json()["leader"]:
                    break
            except httpx.HTTPError:
                pass
            if time.time() > deadline:
                raise SystemExit(f"the service did not come up: {(home / 'serve.log').read_text()[-2000:]}")
            time.sleep(0.2)
        # The first submission loads the GPU catalog; it is not part of the measurement.
        warm = httpx.post(f"{url}/v1/jobs", json={"spec": JOB.format(index="warmup", priority="training")},
                          headers={"Authorization": f"Bearer {teams['infra']}"}, timeout=60)
        assert warm.status_code == 201, warm.text

        rng = random.Random(7)
        team_names = sorted(teams)

        def submit(index: int) -> Callable[[httpx.AsyncClient], Awaitable[int]]:
            team = team_names[index % len(team_names)]
            body = {"spec": JOB.format(index=index, priority=rng.choice(["training", "inference", "batch"]))}

            async def call(http: httpx.AsyncClient) -> int:
                response = await http.post("/v1/jobs", json=body, headers={"Authorization": f"Bearer {teams[team]}"})
                return response.status_code
            return call

        distinct = [(cluster, kind) for cluster in agent_tokens for kind in KINDS][: max(args.notices // 5, 1)]
        posts = [distinct[i % len(distinct)] for i in range(args.notices)]
        rng.shuffle(posts)
        answers: dict[str, int] = {"new": 0, "duplicate": 0}

        def notice(index: int, cluster: str, kind: str) -> Callable[[httpx.AsyncClient], Awaitable[int]]:
            body = {"cluster_id": cluster, "node": str(index % 4), "kind": kind, "action_time": now.isoformat()}

            async def call(http: httpx.AsyncClient) -> int:
                response = await http.post("/v1/notices", json=body,
                                           headers={"Authorization": f"Bearer {agent_tokens[cluster]}"})
                if response.status_code == 202:
                    answers["duplicate" if response.json()["duplicate"] else "new"] += 1
                return response.status_code
            return call

        async def health(http: httpx.AsyncClient) -> int:
            return (await http.get("/v1/health")).status_code

        phases = [
            asyncio.run(run_phase("health (baseline)", url, args.clients, [health] * args.jobs)),
            asyncio.run(run_phase("POST /v1/jobs", url, args.clients, [submit(i) for i in range(args.jobs)])),
            asyncio.run(run_phase("POST /v1/notices", url, args.clients,
                                  [notice(i, c, k) for i, (c, k) in enumerate(posts)])),
        ]

        with store.transaction() as s:
            names = [n for (n,) in s.execute(JobRow.__table__.select().with_only_columns(JobRow.name))
                     if n.startswith("load-") and n != "load-warmup"]
            states = {st for (st,) in s.execute(JobRow.__table__.select().with_only_columns(JobRow.state))}
            keys = [k for (k,) in s.execute(NoticeRow.__table__.select().with_only_columns(NoticeRow.dedup_key))]
        store.dispose()

        print(f"one `broker serve` on PostgreSQL, {args.clients} concurrent clients; engine not stepping "
              f"(jobs stay PENDING): the API and the store only")
        print(f"{'phase':<20} {'requests':>9} {'req/s':>8} {'p50 ms':>8} {'p99 ms':>8}  statuses")
        base = phases[0]
        for phase in phases:
            print(f"{phase.name:<20} {phase.requests:>9} {phase.rate:>8.0f} {phase.pct(0.5):>8.1f} "
                  f"{phase.pct(0.99):>8.1f}  {dict(sorted(phase.statuses.items()))}")
        for phase in phases[1:]:
            print(f"{phase.name}: {phase.rate / base.rate:.2f}x the baseline's req/s, "
                  f"p99 {phase.pct(0.99) / base.pct(0.99):.1f}x")
        jobs_once = len(names) == args.jobs and len(set(names)) == args.jobs
        notices_once = sorted(keys) == sorted(f"{c}:{k}" for c, k in distinct)
        answered = answers == {"new": len(distinct), "duplicate": args.notices - len(distinct)}
        print(f"jobs recorded exactly once: {jobs_once} ({len(set(names))} distinct of {args.jobs} submitted; "
              f"states {sorted(states - {'RUNNING'})})")
        print(f"notices recorded exactly once: {notices_once} ({len(keys)} rows for {len(distinct)} distinct "
              f"notices in {args.notices} posts; answered new/duplicate: {answers['new']}/{answers['duplicate']}, "
              f"{'as expected' if answered else 'NOT as expected'})")
        if not (jobs_once and notices_once and answered):
            raise SystemExit(1)
    finally:
        if server is not None:
            server.send_signal(signal.SIGTERM)
            try:
                server.wait(timeout=20)
            except subprocess.TimeoutExpired:
                server.kill()
        with psycopg.connect(args.postgres, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


if __name__ == "__main__":
    main()
