"""Writing ledgers through the store, as the engine does: jobs, clusters and one row per cluster-minute per holder.

``demo_ledger(store, start)`` is a small fleet over three days (three clouds, two teams, a preemption
and migration, fragmentation, waiting and finished-but-held GPUs), used by the tests and the docs.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import insert

from broker.store import Store
from broker.store.tables import ClusterRow, JobRow, LedgerRow

DEMO_START = datetime(2026, 3, 2, 0, 0, tzinfo=UTC)


@dataclass
class LedgerWriter:
    store: Store
    rows: list[dict[str, Any]] = field(default_factory=list)
    _clusters: dict[str, ClusterRow] = field(default_factory=dict)

    def job(self, job_id: str, name: str, team: str, *, preemptions: int = 0, migrations: int = 0,
            work_lost_s: float = 0.0, zones: list[str] | None = None, state: str = "SUCCEEDED",
            gpus: int = 8, nodes: int = 1) -> None:
        now = DEMO_START
        with self.store.transaction() as s:
            s.add(JobRow(id=job_id, name=name, team=team, state=state, priority=500, spec={"run": "train"},
                         backend="local", num_nodes=nodes, gpus_per_node=gpus // nodes, checkpoint_dir="ckpt",
                         created_at=now, updated_at=now, zones=zones or [], preemptions=preemptions,
                         migrations=migrations, work_lost_s=work_lost_s, attempt=migrations))

    def cluster(self, cluster_id: str, *, cloud: str, region: str, zone: str, instance_type: str,
                accelerator: str, gpus_per_node: int, nodes: int, price: float, on_demand: float,
                job_id: str | None, spot: bool = True) -> None:
        row = ClusterRow(id=cluster_id, launch_key=f"launch:{cluster_id}", job_id=job_id, backend="local",
                         cloud=cloud, region=region, zone=zone, instance_type=instance_type,
                         accelerator=accelerator, gpus_per_node=gpus_per_node, num_nodes=nodes, spot=spot,
                         price_per_node_hour=price, on_demand_price_per_node_hour=on_demand, state="TERMINATED",
                         created_at=DEMO_START, handle={})
        with self.store.transaction() as s:
            s.add(row)
        self._clusters[cluster_id] = row

    def minutes(self, cluster_id: str, start: datetime, count: int, holder: str, usage: str, gpus: float,
                team: str | None = None) -> datetime:
        """``count`` minutes of ``gpus`` GPUs of a cluster from ``start``; returns the minute after."""
        c = self._clusters[cluster_id]
        share = gpus / c.gpus_per_node  # nodes' worth of GPUs this row covers
        job_id = holder.removeprefix("job:") if holder.startswith("job:") else None
        for i in range(count):
            self.rows.append(dict(
                cluster_id=cluster_id, minute=start + timedelta(minutes=i), holder=holder, job_id=job_id,
                team=team, usage=usage, cloud=c.cloud, region=c.region, zone=c.zone,
                instance_type=c.instance_type, accelerator=c.accelerator, nodes=c.num_nodes, gpus=gpus,
                spot=c.spot, price_per_node_hour=c.price_per_node_hour,
                on_demand_price_per_node_hour=c.on_demand_price_per_node_hour,
                cost=c.price_per_node_hour * share / 60, on_demand_cost=c.on_demand_price_per_node_hour * share / 60,
            ))
        return start + timedelta(minutes=count)

    def flush(self) -> None:
        with self.store.transaction() as s:
            for i in range(0, len(self.rows), 5000):
                s.execute(insert(LedgerRow), self.rows[i:i + 5000])


def demo_ledger(store: Store, start: datetime = DEMO_START) -> LedgerWriter:
    w = LedgerWriter(store)
    w.job("j-llm", "llama-finetune", "nlp", preemptions=1, migrations=1, work_lost_s=1500,
          zones=["us-east-1a", "us-central1-a"], gpus=16, nodes=2)
    w.job("j-vit", "vit-pretrain", "vision", gpus=6)
    w.job("j-eval", "eval-sweep", "nlp", gpus=1)
    w.job("j-seg", "segmenter", "vision", preemptions=2, migrations=2, work_lost_s=2400,
          zones=["eastus-1"], gpus=8, state="RUNNING")
    w.cluster("c-aws-1", cloud="aws", region="us-east-1", zone="us-east-1a", instance_type="p4d.24xlarge",
              accelerator="A100", gpus_per_node=8, nodes=2, price=11.57, on_demand=32.77, job_id="j-llm")
    w.cluster("c-gcp-1", cloud="gcp", region="us-central1", zone="us-central1-a", instance_type="a2-highgpu-8g",
              accelerator="A100", gpus_per_node=8, nodes=2, price=8.80, on_demand=29.39, job_id="j-llm")
    w.cluster("c-az-1", cloud="azure", region="eastus", zone="eastus-1", instance_type="Standard_ND96asr_v4",
              accelerator="A100", gpus_per_node=8, nodes=1, price=7.35, on_demand=27.20, job_id="j-vit")
    w.cluster("c-aws-2", cloud="aws", region="us-west-2", zone="us-west-2b", instance_type="g5.xlarge",
              accelerator="A10G", gpus_per_node=1, nodes=1, price=1.006, on_demand=1.006, job_id="j-eval",
              spot=False)
    w.cluster("c-az-2", cloud="azure", region="eastus", zone="eastus-1", instance_type="Standard_ND96asr_v4",
              accelerator="A100", gpus_per_node=8, nodes=1, price=7.10, on_demand=27.20, job_id="j-seg")

    # llama: up on AWS, preempted after 10 h, migrated to GCP, finished, cluster waited before teardown.
    t = w.minutes("c-aws-1", start, 14, "job:j-llm", "provisioning", 16, "nlp")
    t = w.minutes("c-aws-1", t, 600, "job:j-llm", "running", 16, "nlp")
    w.minutes("c-aws-1", t, 4, "job:j-llm", "restarting", 16, "nlp")  # checkpoint before the node goes
    t = w.minutes("c-gcp-1", t, 6, "idle:provisioning", "provisioning", 16)
    t = w.minutes("c-gcp-1", t, 12, "job:j-llm", "restarting", 16, "nlp")
    t = w.minutes("c-gcp-1", t, 1500, "job:j-llm", "running", 16, "nlp")
    t = w.minutes("c-gcp-1", t, 10, "job:j-llm", "finished", 16, "nlp")
    w.minutes("c-gcp-1", t, 45, "idle:waiting", "waiting", 16)

    # vit: 6 of 8 GPUs for 30 h; the other 2 fit no queued gang.
    t0 = start + timedelta(hours=6)
    t = w.minutes("c-az-1", t0, 9, "idle:provisioning", "provisioning", 8)
    w.minutes("c-az-1", t, 1800, "job:j-vit", "running", 6, "vision")
    w.minutes("c-az-1", t, 1800, "idle:unallocated", "unallocated", 2)

    # eval: on-demand A10G for 5 h, a day later.
    t = w.minutes("c-aws-2", start + timedelta(hours=30), 3, "idle:provisioning", "provisioning", 1)
    w.minutes("c-aws-2", t, 300, "job:j-eval", "running", 1, "nlp")

    # seg: preempted twice in place, restarts eat time; still running at the end of the window.
    t = w.minutes("c-az-2", start + timedelta(hours=40), 7, "idle:provisioning", "provisioning", 8)
    for _ in range(2):
        t = w.minutes("c-az-2", t, 240, "job:j-seg", "running", 8, "vision")
        t = w.minutes("c-az-2", t, 25, "job:j-seg", "restarting", 8, "vision")
    w.minutes("c-az-2", t, 300, "job:j-seg", "running", 8, "vision")
    w.flush()
    return w
