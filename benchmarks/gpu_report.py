"""The report's GPU queries over a month of a 1,000-GPU fleet on PostgreSQL.

Fills a fresh database with 125 finished 8-GPU jobs that each ran the whole 30 days: their hourly
GPU roll-up (90,000 rows: what the report reads for whole hours) and their per-minute GPU rows for
the first and last two hours (240,000 rows: the window's partial hours at its ends are read from
minutes). Then times, best of ``--repeat``: the report's measured GPU-hours for the month, the
right-sizing section's read, and ``broker status``'s ``gpu`` for every job; beside the same calls
on an empty database in the same run, and beside summing 118 minutes of raw GPU minutes (what a
query without the roll-up reads; a month holds about 366 times as many).

    python benchmarks/gpu_report.py [--postgres URL] [--repeat 3]
"""

from __future__ import annotations

import argparse
import os
import time
import uuid
from collections.abc import Callable
from datetime import UTC, datetime, timedelta

import psycopg

from broker.reports.rightsizing import right_sizing
from broker.reports.sums import JobCell, measured_gpu_hours
from broker.reports.window import Window
from broker.status.orm_source import SessionSource
from broker.store import Store, open_store

JOBS, GPUS = 125, 8


def fill(url: str, start: datetime) -> None:
    with psycopg.connect(url.replace("postgresql+psycopg://", "postgresql://"), autocommit=True) as conn:
        conn.execute("""
            INSERT INTO jobs (id, name, team, state, priority, spec, backend, num_nodes, gpus_per_node, accelerator,
                              checkpoint_dir, attempt, preemptions, migrations, work_lost_s, zones, created_at,
                              updated_at)
            SELECT 'j-' || lpad(i::text, 4, '0'), 'job-' || (i %% 20), 'team-' || (i %% 10), 'SUCCEEDED', 500, '{}',
                   'local', 1, 8, 'A100', '/ckpt', 1, 0, 0, 0.0, '[]', %(start)s, %(start)s
            FROM generate_series(1, %(jobs)s) AS i""", {"start": start, "jobs": JOBS})
        conn.execute("""
            INSERT INTO gpu_rollup (job_id, node, hour, gpu_minutes, measured_seconds, utilization_seconds,
                                    peak_memory_mb, memory_total_mb, peak_utilization)
            SELECT 'j-' || lpad(i::text, 4, '0'), '0', %(start)s + h * interval '1 hour', 480, 28800.0,
                   28800.0 * (10 + i %% 80), 20000.0 + 100 * (i %% 100), 81920.0, 100.0
            FROM generate_series(1, %(jobs)s) AS i, generate_series(0, 719) AS h""", {"start": start, "jobs": JOBS})
        conn.execute("""
            INSERT INTO gpu_minutes (job_id, attempt, cluster_id, node, gpu, uuid, started_at, ended_at, samples,
                                     seconds, utilization_mean, utilization_max, memory_used_mb_max, memory_total_mb,
                                     received_at)
            SELECT 'j-' || lpad(i::text, 4, '0'), 1, 'c-' || i, '0', g, 'GPU-' || i || '-' || g,
                   t, t + interval '1 minute', 12, 60.0, 10 + i %% 80, 20 + i %% 80, 20000.0, 81920.0, t
            FROM generate_series(1, %(jobs)s) AS i, generate_series(0, 7) AS g,
                 (SELECT %(start)s + m * interval '1 minute' AS t FROM generate_series(0, 119) AS m
                  UNION ALL SELECT %(start)s + interval '718 hours' + m * interval '1 minute'
                  FROM generate_series(0, 119) AS m) AS minutes""", {"start": start, "jobs": JOBS})
        conn.execute("ANALYZE")


def best(run: Callable[[], object], repeat: int) -> float:
    times = []
    for _ in range(repeat):
        began = time.perf_counter()
        run()
        times.append(time.perf_counter() - began)
    return min(times)


def calls(store: Store, window: Window) -> dict[str, Callable[[], object]]:
    cells = [JobCell(f"j-{i:04d}", "running", True, 720 * 60.0 * GPUS, 720 * 8 * 1.5, 720 * 8 * 4.0, 0.0)
             for i in range(1, JOBS + 1)]

    def measured() -> object:
        with store.transaction() as s:
            return measured_gpu_hours(s, store.dialect, window, None)

    def sizing() -> object:
        with store.transaction() as s:
            return right_sizing(s, cells, [])

    def status() -> object:
        with store.transaction() as s:
            source = SessionSource(s)
            return [source.gpu(f"j-{i:04d}") for i in range(1, JOBS + 1)]

    return {"report: measured GPU-hours, 30 days": measured, "report: right-sizing read": sizing,
            f"status gpu, {JOBS} jobs one by one": status}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--postgres", default=os.environ.get("BROKER_TEST_POSTGRES",
                                                             "postgresql://postgres@127.0.0.1:5432/postgres"))
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    names = [f"broker_gpu_{uuid.uuid4().hex[:8]}" for _ in range(2)]
    base = args.postgres.rsplit("/", 1)[0]
    with psycopg.connect(args.postgres, autocommit=True) as conn:
        for name in names:
            conn.execute(f'CREATE DATABASE "{name}"')
    stores: list[Store] = []
    try:
        empty_url, full_url = (f"{base}/{n}" for n in names)
        empty, full = open_store(empty_url), open_store(full_url)
        stores = [empty, full]
        now = datetime.now(UTC).replace(minute=0, second=0, microsecond=0)
        start = now - timedelta(hours=720)
        began = time.perf_counter()
        fill(full_url, start)
        print(f"filled {JOBS * 720:,} roll-up rows and {JOBS * GPUS * 240:,} GPU minutes "
              f"in {time.perf_counter() - began:.1f} s")
        window = Window(start + timedelta(minutes=30), now - timedelta(minutes=30))
        print(f"{'query':40s} {'empty s':>8s} {'full s':>8s}")
        for (name, on_empty), on_full in zip(calls(empty, window).items(), calls(full, window).values(), strict=True):
            print(f"{name:40s} {best(on_empty, args.repeat):8.3f} {best(on_full, args.repeat):8.3f}")
        with full.transaction() as s:
            # Inside one hour's edges: read from the minutes alone (118 minutes of 1,000 GPUs).
            with_minutes = Window(start + timedelta(minutes=1), start + timedelta(minutes=119))
            raw = best(lambda: measured_gpu_hours(s, full.dialect, with_minutes, None), args.repeat)
        print(f"{'raw minutes of 118 min (no roll-up)':40s} {'':8s} {raw:8.3f}  (a month: about {raw * 366:.0f} s)")
    finally:
        for store in stores:
            store.dispose()
        with psycopg.connect(args.postgres, autocommit=True) as conn:
            for name in names:
                conn.execute(f'DROP DATABASE IF EXISTS "{name}"')


if __name__ == "__main__":
    main()
