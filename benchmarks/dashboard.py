"""Render time and size of each dashboard page with 10,000 jobs, 1 million ledger rows and a price book of
5,000 quotes in PostgreSQL.

    python benchmarks/dashboard.py [--postgres URL] [--jobs 10000] [--ledger-rows 1000000] [--quotes 5000]
                                   [--repeat 3]

Fills a fresh database with SQL (generate_series: a few seconds), then times each page over HTTP
in-process (the FastAPI app, signed in as the admin, who sees every team): the Overview at 1, 7
and 30 days, Jobs sorted by each column both ways and filtered, a job's page, Clusters, the Market
(by GPU type, sorted, filtered, the CPU-only offers, one GPU type's page), Simulate; the median of
``--repeat`` and the page's size, next to the same page on an empty database measured in the same
run. The targets are under 0.5 s and under 500 KB. With Debian's chromium installed, the Market
page's height in the browser (1280 px wide) too, and whether a full-page screenshot of it is taken.

Then, on the full database in the same run, per window: the per-fact rows the report builder
used to read, from the ledger's minutes (the first builder) and from the hourly roll-up (the
second, which then grouped them in Python), against the whole report as built now (grouped in the
database), with every grouping (`broker report`) and with the Overview's.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path

import psycopg
from fastapi.testclient import TestClient

from broker.api.app import create_app
from broker.clock import WallClock
from broker.intake import Intake
from broker.store import open_store
from broker.tokens import create_api_token

CLOUDS = (("aws", "us-east-1a", "p4d.24xlarge"), ("gcp", "us-central1-a", "a2-highgpu-8g"),
          ("azure", "eastus-1", "Standard_ND96asr_v4"))


def fill_quotes(conn: psycopg.Connection, quotes: int, now: datetime) -> None:
    """A price book as three clouds' pollers fill it: ``quotes`` offers (one quote each, confirmed now) over
    16 GPU types, 40 regions and 6 zones each per cloud, one in ten CPU-only (accelerator '', 0 GPUs)."""
    conn.execute("""
        INSERT INTO price_quotes (cloud, region, zone, instance_type, accelerator, gpus_per_node, spot_price,
                                  on_demand_price, capacity_score, available_nodes, stale, observed_at, confirmed_at)
        SELECT (ARRAY['aws','gcp','azure'])[1 + i %% 3], 'region-' || ((i / 3) %% 40),
               'region-' || ((i / 3) %% 40) || (ARRAY['a','b','c','d','e','f'])[1 + (i / 120) %% 6],
               CASE WHEN i %% 10 = 9 THEN 'cpu-' || i ELSE 'gpu-' || i END,
               CASE WHEN i %% 10 = 9 THEN '' ELSE (ARRAY['A100','A100-80GB','H100','H200','L4','L40S','A10G','T4',
                    'V100','K80','P100','A10','B200','MI300X','RTX6000','A40'])[1 + (i / 7) %% 16] END,
               CASE WHEN i %% 10 = 9 THEN 0 ELSE (ARRAY[1,2,4,8])[1 + i %% 4] END,
               0.35 * (0.4 + 0.3 * (i %% 11) + 1.1 * (ARRAY[1,2,4,8])[1 + i %% 4]),
               0.4 + 0.3 * (i %% 11) + 1.1 * (ARRAY[1,2,4,8])[1 + i %% 4], 1 + i %% 10, i %% 5, false,
               %(now)s - interval '7 days', %(now)s
        FROM generate_series(1, %(quotes)s) AS i""", {"now": now, "quotes": quotes})


def fill(db_url: str, jobs: int, ledger_rows: int, now: datetime, quotes: int = 5000) -> None:
    """Jobs of ten teams started evenly over 30 days, a cluster per job, 8 GPUs of each held, and its ledger minutes."""
    start = now - timedelta(days=30)
    clusters = jobs
    per_cluster = max(ledger_rows // clusters, 1)
    step = 30 * 86400 / jobs  # seconds between job starts: the jobs spread over the 30 days
    with psycopg.connect(db_url.replace("postgresql+psycopg://", "postgresql://"), autocommit=True) as conn:
        conn.execute("""
            INSERT INTO jobs (id, name, team, state, priority, spec, backend, num_nodes, gpus_per_node, accelerator,
                              checkpoint_dir, attempt, preemptions, migrations, work_lost_s, zones, created_at,
                              updated_at, work_s)
            SELECT 'j-' || lpad(i::text, 6, '0'), 'job-' || i, 'team-' || (i %% 10),
                   (ARRAY['RUNNING','SUCCEEDED','PENDING','FAILED','CHECKPOINTING'])[1 + i %% 5],
                   100 * (i %% 9), '{}', 'local', 1, 8, 'A100', '/ckpt', 1, i %% 3, i %% 2, (i %% 7) * 60.0,
                   '["us-east-1a"]', %(start)s + (i * %(step)s * interval '1 second'),
                   %(start)s + (i * %(step)s * interval '1 second'),
                   86400.0
            FROM generate_series(1, %(jobs)s) AS i""", {"start": start, "jobs": jobs, "step": step})
        conn.execute("""
            INSERT INTO clusters (id, launch_key, job_id, backend, cloud, region, zone, instance_type, accelerator,
                                  gpus_per_node, num_nodes, spot, price_per_node_hour, on_demand_price_per_node_hour,
                                  state, handle, created_at, up_at)
            SELECT 'c-' || i, 'c-' || i, 'j-' || lpad(i::text, 6, '0'), 'local',
                   (ARRAY['aws','gcp','azure'])[1 + i %% 3], 'r',
                   (ARRAY['us-east-1a','us-central1-a','eastus-1'])[1 + i %% 3],
                   (ARRAY['p4d.24xlarge','a2-highgpu-8g','Standard_ND96asr_v4'])[1 + i %% 3], 'A100', 8, 1, true,
                   10.0 + i %% 5, 32.0, CASE WHEN i %% 20 = 0 THEN 'UP' ELSE 'TERMINATED' END, '{}',
                   %(start)s + (i * %(step)s * interval '1 second'), %(start)s + (i * %(step)s * interval '1 second')
            FROM generate_series(1, %(clusters)s) AS i""", {"start": start, "clusters": clusters, "step": step})
        conn.execute("""
            INSERT INTO allocations (job_id, cluster_id, attempt, gpus, started_at, running_at)
            SELECT 'j-' || lpad(i::text, 6, '0'), 'c-' || i, 1, '{"0": [0, 1, 2, 3, 4, 5, 6, 7]}',
                   %(start)s + (i * %(step)s * interval '1 second'), %(start)s + (i * %(step)s * interval '1 second')
            FROM generate_series(1, %(clusters)s) AS i""", {"start": start, "clusters": clusters, "step": step})
        conn.execute("""
            INSERT INTO ledger (cluster_id, minute, holder, job_id, team, usage, cloud, region, zone, instance_type,
                                accelerator, nodes, gpus, seconds, spot, price_per_node_hour,
                                on_demand_price_per_node_hour, cost, on_demand_cost)
            SELECT 'c-' || c, %(start)s + (c * %(step)s * interval '1 second') + (m * interval '1 minute'),
                   'job:j-' || lpad(c::text, 6, '0'), 'j-' || lpad(c::text, 6, '0'), 'team-' || (c %% 10),
                   CASE WHEN m < 3 THEN 'provisioning' ELSE 'running' END,
                   (ARRAY['aws','gcp','azure'])[1 + c %% 3], 'r',
                   (ARRAY['us-east-1a','us-central1-a','eastus-1'])[1 + c %% 3],
                   (ARRAY['p4d.24xlarge','a2-highgpu-8g','Standard_ND96asr_v4'])[1 + c %% 3], 'A100', 1, 8, 60, true,
                   10.0 + c %% 5, 32.0, (10.0 + c %% 5) / 60, 32.0 / 60
            FROM generate_series(1, %(clusters)s) AS c, generate_series(0, %(per)s - 1) AS m""",
                     {"start": start, "clusters": clusters, "per": per_cluster, "step": step})
        fill_quotes(conn, quotes, now)
        for hour in range(0, 24 * 7, 1):
            for cloud, zone, itype in CLOUDS:
                at = now - timedelta(hours=hour)
                conn.execute("""
                    INSERT INTO price_quotes (cloud, region, zone, instance_type, accelerator, gpus_per_node,
                                              spot_price, on_demand_price, available_nodes, stale, observed_at,
                                              confirmed_at)
                    VALUES (%s, 'r', %s, %s, 'A100', 8, %s, 32.0, 4, false, %s, %s)""",
                             (cloud, zone, itype, 10.0 + hour % 4, at, at + timedelta(minutes=59)))
        conn.execute("ANALYZE")


def time_pages(db_url: str, home: Path, repeat: int) -> dict[str, tuple[float, int]]:
    """Per page: (median seconds of ``repeat`` renders, bytes of HTML)."""
    store = open_store(db_url)
    try:
        token = create_api_token(store, "admin").token
        client = TestClient(create_app(store, WallClock(), Intake(home, "local", None)))
        assert client.post("/login", data={"token": token}, follow_redirects=False).status_code == 303
        first_job = "j-000001"
        pages = {"overview (1d)": "/?since=1d", "overview (7d)": "/", "overview (30d)": "/?since=30d",
                 "jobs": "/jobs"}
        for column in ("submitted", "name", "team", "state", "priority", "cost"):
            pages[f"jobs by {column}"] = f"/jobs?sort={column}"
            pages[f"jobs by {column} asc"] = f"/jobs?sort={column}&order=asc"
        pages.update({"jobs, one state": "/jobs?state=RUNNING", "jobs, one team": "/jobs?team=team-3",
                      "jobs, name search": "/jobs?q=job-12", "jobs, all filters": "/jobs?state=RUNNING&team=team-5"
                      "&q=job-1&sort=cost", "job page": f"/jobs/{first_job}", "clusters": "/clusters",
                      "market": "/market", "market by saving": "/market?sort=saving&order=desc",
                      "market, one cloud": "/market?cloud=gcp&region=region-7", "market, CPU-only p2":
                      "/market?kind=cpu&page=2", "market, one GPU type": "/market/gpu/H100",
                      "simulate (form)": "/simulate"})
        times = {}
        for name, path in pages.items():
            took = []
            for _ in range(repeat):
                began = time.perf_counter()
                response = client.get(path)
                took.append(time.perf_counter() - began)
                assert response.status_code in (200, 404), (path, response.status_code)
            times[name] = (statistics.median(took), len(response.content))
        return times
    finally:
        store.dispose()


def market_height(db_url: str, home: Path) -> tuple[int, bool] | None:
    """The Market page's height in Debian's chromium (1280 px wide) and whether a full-page screenshot was
    taken; None without chromium or Playwright."""
    chromium = "/usr/bin/chromium"
    if not os.path.exists(chromium):
        return None
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        return None
    from broker.api.app import BackgroundServer

    store = open_store(db_url)
    server = BackgroundServer(create_app(store, WallClock(), Intake(home, "local", None))).start()
    try:
        deadline = time.monotonic() + 60
        while not server.server.started and time.monotonic() < deadline:
            time.sleep(0.05)
        token = create_api_token(store, "admin").token
        with sync_playwright() as playwright:
            browser = playwright.chromium.launch(executable_path=chromium, args=["--headless", "--no-sandbox",
                                                                                 "--disable-gpu"])
            try:
                page = browser.new_context(viewport={"width": 1280, "height": 900}).new_page()
                page.goto(server.url + "/login")
                page.fill("input[name=token]", token)
                page.click("button[type=submit]")
                page.wait_for_load_state()
                page.goto(server.url + "/market")
                height = int(page.evaluate("document.documentElement.scrollHeight"))
                shot = Path(tempfile.mkdtemp(prefix="broker-dash-shot-")) / "market.png"
                page.screenshot(path=str(shot), full_page=True, timeout=30_000)
                return height, shot.stat().st_size > 0
            finally:
                browser.close()
    finally:
        server.stop()
        store.dispose()


def time_reads(db_url: str, repeat: int) -> list[tuple[str, float, float, float, float]]:
    """Per window: seconds for the per-fact rows read from the ledger's minutes (the first builder) and from the
    roll-up (the second one, before its Python), and for the whole report as built now, with every grouping
    and with the page's; best of ``repeat``."""
    from sqlalchemy import func, select

    from broker.reports.build import build_report
    from broker.reports.sums import day_of
    from broker.reports.window import Window
    from broker.store.rollup import LedgerRollupRow
    from broker.store.tables import LedgerRow
    from broker.web.overview import SHOWN_GROUPS

    store = open_store(db_url)

    def best(run: object) -> float:
        assert callable(run)
        times = []
        for _ in range(repeat):
            began = time.perf_counter()
            run()
            times.append(time.perf_counter() - began)
        return min(times)

    def facts(table: type[LedgerRow] | type[LedgerRollupRow], window: Window) -> None:
        at = table.minute if table is LedgerRow else table.hour  # type: ignore[union-attr]
        keys = (table.cluster_id, table.holder, table.job_id, table.team, table.usage, table.cloud, table.region,
                table.zone, table.accelerator, table.instance_type, table.spot, day_of(store.dialect, at))
        sums = ((func.sum(LedgerRow.gpus * LedgerRow.seconds / 60.0), func.sum(LedgerRow.cost),
                 func.sum(LedgerRow.on_demand_cost), func.count()) if table is LedgerRow else
                (func.sum(LedgerRollupRow.gpu_minutes), func.sum(LedgerRollupRow.cost),
                 func.sum(LedgerRollupRow.on_demand_cost), func.sum(LedgerRollupRow.pieces)))
        with store.transaction() as s:
            s.execute(select(*keys, *sums).where(at >= window.start, at < window.end).group_by(*keys)).all()

    try:
        now = datetime.now(UTC)
        rows = []
        for days in (1, 7, 30):
            w = Window(now - timedelta(days=days), now)
            rows.append((f"report, {days} days", best(lambda w=w: facts(LedgerRow, w)),
                         best(lambda w=w: facts(LedgerRollupRow, w)), best(lambda w=w: build_report(store, w)),
                         best(lambda w=w: build_report(store, w, dimensions=SHOWN_GROUPS))))
        return rows
    finally:
        store.dispose()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--postgres", default=os.environ.get("BROKER_TEST_POSTGRES",
                                                             "postgresql://postgres@127.0.0.1:5432/postgres"))
    parser.add_argument("--jobs", type=int, default=10_000)
    parser.add_argument("--ledger-rows", type=int, default=1_000_000)
    parser.add_argument("--quotes", type=int, default=5000)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    names = [f"broker_dash_{uuid.uuid4().hex[:8]}" for _ in range(2)]
    base = args.postgres.rsplit("/", 1)[0]
    with psycopg.connect(args.postgres, autocommit=True) as conn:
        for name in names:
            conn.execute(f'CREATE DATABASE "{name}"')
    home = Path(tempfile.mkdtemp(prefix="broker-dash-"))
    try:
        empty_url, full_url = (f"{base}/{n}" for n in names)
        open_store(empty_url).dispose()
        open_store(full_url).dispose()
        began = time.perf_counter()
        fill(full_url, args.jobs, args.ledger_rows, datetime.now(UTC), args.quotes)
        with psycopg.connect(full_url, autocommit=True) as conn:
            rows = conn.execute("SELECT count(*) FROM ledger").fetchone()[0]  # type: ignore[index]
            jobs = conn.execute("SELECT count(*) FROM jobs").fetchone()[0]  # type: ignore[index]
            quotes = conn.execute("SELECT count(*) FROM price_quotes").fetchone()[0]  # type: ignore[index]
        print(f"filled {jobs:,} jobs, {rows:,} ledger rows and {quotes:,} price quotes in "
              f"{time.perf_counter() - began:.1f} s")
        empty = time_pages(empty_url, home, args.repeat)
        full = time_pages(full_url, home, args.repeat)
        print(f"{'page':<22} {'empty s':>8} {'empty KB':>8} {'full s':>8} {'full KB':>8}  under 0.5 s and 500 KB")
        for name, (took, size) in full.items():
            ok = took < 0.5 and size < 500_000
            print(f"{name:<22} {empty[name][0]:>8.3f} {empty[name][1] / 1000:>8.1f} {took:>8.3f} {size / 1000:>8.1f}"
                  f"  {'yes' if ok else 'NO'}")
        measured = market_height(full_url, home)
        if measured is None:
            print("\nmarket page height: not measured (no /usr/bin/chromium or Playwright)")
        else:
            print(f"\nmarket page in chromium, 1280 px wide: {measured[0]:,} px tall; full-page screenshot "
                  f"{'taken' if measured[1] else 'NOT taken'}")
        print(f"\n{'full store, same run':<20} {'facts, minutes s':>16} {'facts, roll-up s':>16} "
              f"{'report now s':>12} {'page report s':>13}")
        for what, minutes, rollup, report, page in time_reads(full_url, args.repeat):
            print(f"{what:<20} {minutes:>16.3f} {rollup:>16.3f} {report:>12.3f} {page:>13.3f}")
    finally:
        with psycopg.connect(args.postgres, autocommit=True) as conn:
            for name in names:
                conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


if __name__ == "__main__":
    main()
