"""A small fleet's history written straight to the store: jobs of two teams, clusters, GPUs, ledger, prices."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from broker.market.book import PriceBook
from broker.store import Store
from broker.store.gpu import GpuMinuteRow
from broker.store.tables import AllocationRow, ClusterRow, JobEventRow, JobRow, LedgerRow, NoticeRow
from providers.base import SpotQuote

NOW = datetime.now(UTC).replace(second=0, microsecond=0)
DAY0 = NOW - timedelta(days=3)
# (cluster, cloud, zone, instance, accelerator, gpus per node, nodes, spot $/node-h, on-demand $/node-h)
CLUSTERS = [
    ("c-aws", "aws", "us-east-1a", "p4d.24xlarge", "A100", 8, 1, 9.8, 32.77),
    ("c-gcp", "gcp", "us-central1-a", "a2-highgpu-8g", "A100", 8, 1, 11.2, 29.39),
    ("c-azure", "azure", "eastus-1", "Standard_NC24ads_A100_v4", "A100", 1, 2, 1.5, 3.67),
]


def _job(job_id: str, team: str, name: str, state: str, created: datetime, **extra: object) -> JobRow:
    extra.setdefault("zones", [])
    return JobRow(id=job_id, name=name, team=team, state=state, priority=500, spec={}, backend="local",
                  num_nodes=1, gpus_per_node=4, accelerator="A100", checkpoint_dir=f"/ckpt/{job_id}",
                  created_at=created, updated_at=created, **extra)


def seed_fleet(store: Store) -> dict[str, str]:
    """Two teams' jobs on three clouds over three days; returns job ids by role."""
    with store.transaction() as s:
        s.add(_job("j-alpha-run", "alpha", "llama-finetune", "RUNNING", DAY0, work_s=4 * 86400.0,
                   preemptions=1, migrations=1, work_lost_s=1800.0, zones=["us-central1-a", "us-east-1a"],
                   started_at=DAY0))
        s.add(_job("j-alpha-done", "alpha", "eval-sweep", "SUCCEEDED", DAY0, finished_at=DAY0 + timedelta(hours=20)))
        s.add(_job("j-beta-run", "beta", "secret-beta-model", "RUNNING", DAY0, work_s=5 * 86400.0,
                   zones=["eastus-1"], started_at=DAY0))
        s.flush()
        for cid, cloud, zone, itype, acc, gpn, nodes, spot, od in CLUSTERS:
            owner = {"c-aws": "j-alpha-run", "c-gcp": "j-alpha-run", "c-azure": "j-beta-run"}[cid]
            state = "TERMINATED" if cid == "c-gcp" else "UP"
            s.add(ClusterRow(id=cid, launch_key=cid, job_id=owner, backend="local", cloud=cloud, region=zone[:-1],
                             zone=zone, instance_type=itype, accelerator=acc, gpus_per_node=gpn, num_nodes=nodes,
                             spot=True, price_per_node_hour=spot, on_demand_price_per_node_hour=od, state=state,
                             handle={}, created_at=DAY0, up_at=DAY0 + timedelta(minutes=5)))
        s.flush()
        moved = DAY0 + timedelta(days=1, hours=2)
        s.add(AllocationRow(job_id="j-alpha-run", cluster_id="c-gcp", attempt=1, gpus={"0": [0, 1, 2, 3]},
                            started_at=DAY0, running_at=DAY0 + timedelta(minutes=6), stopping_at=moved,
                            ended_at=moved + timedelta(minutes=2), outcome="preempted"))
        s.add(AllocationRow(job_id="j-alpha-run", cluster_id="c-aws", attempt=2, gpus={"0": [0, 1, 2, 3]},
                            started_at=moved + timedelta(minutes=3), running_at=moved + timedelta(minutes=9)))
        s.add(AllocationRow(job_id="j-beta-run", cluster_id="c-azure", attempt=1, gpus={"0": [0], "1": [0]},
                            started_at=DAY0, running_at=DAY0 + timedelta(minutes=6)))
        s.add(NoticeRow(dedup_key="n1", cluster_id="c-gcp", node="node-0", kind="preemption", source="metadata",
                        received_at=moved, detail={}))
        # What the agents measured on j-alpha-run's 4 GPUs, hourly: busy, with GPU 3 idle in its second attempt.
        for attempt, cluster, began, until in ((1, "c-gcp", DAY0 + timedelta(minutes=6), moved),
                                               (2, "c-aws", moved + timedelta(minutes=9), NOW)):
            at = began
            while at < until:
                for gpu in range(4):
                    util = 2.0 if attempt == 2 and gpu == 3 else 70.0 + 5 * gpu
                    s.add(GpuMinuteRow(job_id="j-alpha-run", attempt=attempt, cluster_id=cluster, node="0", gpu=gpu,
                                       uuid=f"GPU-{cluster}-{gpu}", started_at=at, ended_at=at + timedelta(minutes=1),
                                       samples=12, seconds=60.0, utilization_mean=util, utilization_max=util + 10,
                                       memory_used_mb_max=30000.0, memory_total_mb=40960.0, received_at=at))
                at += timedelta(hours=1)
        for job_id, at, kind, old, new in [
                ("j-alpha-run", DAY0, "submitted", None, "PENDING"),
                ("j-alpha-run", DAY0 + timedelta(minutes=1), "transition", "PENDING", "PROVISIONING"),
                ("j-alpha-run", DAY0 + timedelta(minutes=6), "transition", "PROVISIONING", "RUNNING"),
                ("j-alpha-run", moved, "transition", "RUNNING", "CHECKPOINTING"),
                ("j-alpha-run", moved + timedelta(minutes=2), "transition", "CHECKPOINTING", "MIGRATING"),
                ("j-alpha-run", moved + timedelta(minutes=9), "transition", "MIGRATING", "RUNNING"),
                ("j-beta-run", DAY0, "submitted", None, "PENDING"),
                ("j-beta-run", DAY0 + timedelta(minutes=6), "transition", "PENDING", "RUNNING")]:
            s.add(JobEventRow(job_id=job_id, at=at, kind=kind, from_state=old, to_state=new, detail={}))
        rows = []
        # Two hours a day of ledger minutes per cluster: enough for daily bars on each cloud.
        for day in range(3):
            for minute in range(0, 120, 1):
                at = DAY0 + timedelta(days=day, hours=1, minutes=minute)
                for cid, cloud, zone, itype, acc, gpn, nodes, spot, od in CLUSTERS:
                    if (cid == "c-gcp") != (day == 0):
                        continue
                    job = "j-beta-run" if cid == "c-azure" else "j-alpha-run"
                    team = "beta" if cid == "c-azure" else "alpha"
                    usage = "restarting" if minute < 10 and day == 1 else "running"
                    share = (4 / gpn) if gpn == 8 else 1.0
                    rows.append(LedgerRow(cluster_id=cid, minute=at, holder=f"job:{job}", job_id=job, team=team,
                                          usage=usage, cloud=cloud, region=zone[:-1], zone=zone, instance_type=itype,
                                          accelerator=acc, nodes=nodes, gpus=gpn * nodes * share, seconds=60.0,
                                          spot=True, price_per_node_hour=spot, on_demand_price_per_node_hour=od,
                                          cost=spot * nodes * share / 60, on_demand_cost=od * nodes * share / 60))
                    if gpn == 8:
                        rows.append(LedgerRow(cluster_id=cid, minute=at, holder="idle:unallocated", job_id=None,
                                              team=None, usage="unallocated", cloud=cloud, region=zone[:-1],
                                              zone=zone, instance_type=itype, accelerator=acc, nodes=nodes,
                                              gpus=4.0, seconds=60.0, spot=True, price_per_node_hour=spot,
                                              on_demand_price_per_node_hour=od, cost=spot * 0.5 / 60,
                                              on_demand_cost=od * 0.5 / 60))
        s.add_all(rows)
    book = PriceBook(store)
    for hour in range(0, 72, 3):
        at = DAY0 + timedelta(hours=hour)
        wobble = 1 + 0.15 * ((hour // 3) % 5) / 5
        for _cid, cloud, zone, itype, acc, gpn, _nodes, spot, od in CLUSTERS:
            book.record(cloud, [SpotQuote(cloud, zone[:-1], zone, itype, acc, gpn, round(spot * wobble, 3), od, at,
                                          available_nodes=3, capacity_score=7.0)], at=at)
    return {"alpha": "j-alpha-run", "alpha_done": "j-alpha-done", "beta": "j-beta-run"}


GPU_TYPES = ("A100", "A100-80GB", "H100", "H200", "L4", "L40S", "A10G", "T4", "V100", "K80", "P100", "A10", "B200",
             "MI300X", "RTX6000", "A40")
CPU_TYPES = ("m7i.2xlarge", "c7i.4xlarge", "r7i.8xlarge", "n2-standard-8", "Standard_D8s_v5")


def fill_price_book(store: Store, offers: int = 5000, at: datetime | None = None) -> int:
    """A price book as three clouds' pollers fill it: ``offers`` quotes over GPU types and zones, a tenth
    CPU-only (accelerator "", 0 GPUs), each its own offer; returns how many were recorded."""
    at = at or NOW
    book = PriceBook(store)
    by_cloud: dict[str, list[SpotQuote]] = {"aws": [], "gcp": [], "azure": []}
    clouds = list(by_cloud)
    for i in range(offers):
        cloud = clouds[i % 3]
        region = f"{cloud}-region-{(i // 3) % 40}"
        zone = f"{region}{'abcdef'[(i // 120) % 6]}"
        if i % 10 == 9:
            itype, acc, gpus = f"{CPU_TYPES[i % len(CPU_TYPES)]}-{i}", "", 0
        else:
            acc = GPU_TYPES[(i // 7) % len(GPU_TYPES)]
            gpus = (1, 2, 4, 8)[i % 4]
            itype = f"{acc.lower()}-{gpus}x-{i}"
        base = 0.4 + 0.3 * (i % 11) + (0 if gpus == 0 else 1.1 * gpus)
        by_cloud[cloud].append(SpotQuote(cloud, region, zone, itype, acc, gpus, round(base * 0.35, 4), round(base, 4),
                                         at, available_nodes=i % 5, capacity_score=float(1 + i % 10)))
    for cloud, quotes in by_cloud.items():
        book.record(cloud, quotes, at=at)
    return offers
