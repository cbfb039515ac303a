"""The production path end to end: `broker serve --backend skypilot` replicas on PostgreSQL, real clouds stood in.

Two replicas run as processes with SkyPilot's SDK answered by the stand-in API server of
``tests/skystandin`` (through the ``skypilot_sdk`` setting), whose clusters are local processes
running the task's real ``setup`` (the agent wheel installs with uv) and ``run`` (the agent runs
``examples/train.py``), each node beside an EC2 metadata service. The leader polls prices from
the AWS stand-in in EC2's and the Price List's wire formats. The job is submitted with
``broker launch --server``; its checkpoints go to an ``s3://`` dir (a local directory stands for
the mounted bucket). During the run the clouds change prices, take capacity away and give a
spot notice; the leader is SIGKILLed in the middle of the migration that follows.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select

from broker.market.book import PriceBook
from broker.store import open_store
from broker.store.tables import AllocationRow, CheckpointReportRow, ClusterRow, JobRow, LedgerRow
from broker.tokens import create_api_token
from providers.base import OfferKey
from tests.broker.service.replicas import ROOT, Replica, spawn_replica, wait_for
from tests.fakeclouds.aws import FakeAws, price_list_product, spot_record
from tests.fakeclouds.market import quiet_moto
from tests.fakeclouds.server import FakeServer
from tests.skystandin.balancer import Balancer
from tests.skystandin.server import SkyStandIn

TYPE = "g5.xlarge"
ON_DEMAND = 1.006
STEPS = 1500
REVIEW_SECONDS = 300.0  # a running job's place is reviewed once per this many seconds (planning.REVIEW_SECONDS)
JOB = """\
name: e2e-train
num_nodes: 2
resources:
  accelerators: A10G:1
workdir: {workdir}
run: python train.py --steps {steps} --step-seconds 0.05 --checkpoint-every 20
broker:
  checkpoint:
    dir: s3://e2e-checkpoints/train
    grace: 60s
"""
URGENT = """\
name: urgent
num_nodes: 2
resources:
  accelerators: A10G:1
run: sleep 4
broker:
  priority: inference
  max_price: 1.5
"""


class AwsMarket:
    """The AWS stand-in's spot prices and placement scores, changed as the test goes."""

    def __init__(self, moto_url: str) -> None:
        from moto.ec2.models.availability_zones_and_regions import RegionsAndZonesBackend

        self.zone_ids = {z.name: z.zone_id for region in ("us-east-1", "us-west-2")
                         for z in RegionsAndZonesBackend.zones[region]}
        products = [price_list_product(TYPE, region, ON_DEMAND, 1) for region in ("us-east-1", "us-west-2")]
        self.fake = FakeAws(moto_url, [], [], products, page_size=1000)

    def set(self, zone: str, spot: float, score: int) -> None:
        self.fake.spot_history.append(spot_record(TYPE, zone, self.zone_ids[zone], spot,
                                                  datetime.now(UTC).replace(microsecond=0)))
        self.fake.placement_scores[:] = [s for s in self.fake.placement_scores
                                         if s["AvailabilityZoneId"] != self.zone_ids[zone]]
        self.fake.placement_scores.append({"InstanceType": TYPE, "Region": zone[:-1],
                                           "AvailabilityZoneId": self.zone_ids[zone], "Score": score})


def book_shows(store: Any, zone: str, spot: float, capacity: bool) -> bool:
    for quote in PriceBook(store).latest():
        if quote.zone == zone and quote.instance_type == TYPE:
            likely = quote.capacity_score is None or quote.capacity_score >= 4
            return abs((quote.spot_price or 0) - spot) < 1e-6 and likely == capacity
    return False


def cheapest_with_capacity(store: Any, excluding: set[str]) -> str:
    quotes = [q for q in PriceBook(store).latest() if q.instance_type == TYPE and q.zone not in excluding
              and (q.capacity_score or 0) >= 4 and q.spot_price is not None]
    return min(quotes, key=lambda q: (q.spot_price, q.zone)).zone


def job_row(store: Any, job_id: str) -> JobRow:
    with store.transaction() as s:
        job = s.get(JobRow, job_id)
        assert job is not None
        s.expunge(job)
        return job


def reports(store: Any, job_id: str) -> list[CheckpointReportRow]:
    with store.transaction() as s:
        rows = list(s.scalars(select(CheckpointReportRow).where(CheckpointReportRow.job_id == job_id)
                              .order_by(CheckpointReportRow.id)))
        s.expunge_all()
        return rows


def away_from_review_boundary() -> None:
    """Reviews run once per REVIEW_SECONDS of the wall clock: keep a price change clear of the next one."""
    left = REVIEW_SECONDS - time.time() % REVIEW_SECONDS
    if left < 25:
        time.sleep(left + 1)


def leader(replicas: list[Replica]) -> Replica | None:
    return next((r for r in replicas if r.process.poll() is None and (r.health() or {}).get("leader")), None)


@pytest.mark.slow
@pytest.mark.timeout(420)
def test_serve_on_skypilot_end_to_end(tmp_path: Path, broker_home: Path, postgres_url: str) -> None:
    from moto.server import ThreadedMotoServer

    quiet_moto()
    moto = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    moto.start()
    host, port = moto.get_host_and_port()
    market = AwsMarket(f"http://{host}:{port}")
    # us-east-1b is the cheapest on price, but its placement score says a launch is unlikely there.
    for zone, spot, score in (("us-east-1a", 0.45, 9), ("us-east-1b", 0.20, 2), ("us-west-2a", 0.55, 9),
                              ("us-west-2b", 0.40, 9)):
        market.set(zone, spot, score)
    aws = FakeServer(market.fake).start()
    sky = SkyStandIn(tmp_path / "sky").start()
    balancer = Balancer().start()
    store = open_store(postgres_url)
    token = create_api_token(store, "research").token
    env = {"BROKER_HOME": str(broker_home), "BROKER_DB_URL": postgres_url, "BROKER_BACKEND": "skypilot",
           "BROKER_SKYPILOT_SDK": "tests.skystandin.sdk:sky", "BROKER_SKY_STANDIN_URL": sky.url,
           "BROKER_PUBLIC_URL": balancer.url, "BROKER_LEADER_CHECK_SECONDS": "1", "BROKER_POLL_SECONDS": "0.2",
           "BROKER_SKYPILOT_REFRESH_SECONDS": "0.5", "BROKER_SELECTION_POLICY": "cheapest_spot",
           "BROKER_PRICE_POLL_SECONDS": json.dumps({"aws": 2}), "BROKER_AWS_REGIONS": "us-east-1,us-west-2",
           "AWS_ENDPOINT_URL_EC2": aws.url, "AWS_ENDPOINT_URL_PRICING": aws.url, "AWS_ACCESS_KEY_ID": "testing",
           "AWS_SECRET_ACCESS_KEY": "testing", "AWS_EC2_METADATA_DISABLED": "true"}
    replicas = [spawn_replica("a", env, tmp_path), spawn_replica("b", env, tmp_path)]
    balancer.backends = [r.url for r in replicas]
    began = time.time()
    try:
        first = wait_for(lambda: leader(replicas), 120, "a leader")
        wait_for(lambda: book_shows(store, "us-west-2b", 0.40, True) or None, 60, "the first price poll")

        # --- submitted with `broker launch --server`; it starts where the price book is cheapest
        job_file = tmp_path / "train.yaml"
        job_file.write_text(JOB.format(workdir=ROOT / "examples", steps=STEPS))
        sky.hold("us-west-2b")
        launched = subprocess.run([sys.executable, "-m", "broker", "launch", str(job_file), "--server",
                                   replicas[1].url, "--detach"], cwd=ROOT, capture_output=True, text=True,
                                  env={**os.environ, "BROKER_TOKEN": token, "BROKER_HOME": str(broker_home)},
                                  timeout=120)
        assert launched.returncode == 0, launched.stderr
        job_id = re.search(r"submitted (j-[0-9a-f]+)", launched.stdout).group(1)  # type: ignore[union-attr]
        wait_for(lambda: sky.launches() or None, 60, "the first launch")
        assert sky.launches()[0][1] == "us-west-2b" == cheapest_with_capacity(store, set())

        # --- prices move while it comes up: us-east-1a is now the cheapest; the policy moves the job
        market.set("us-east-1a", 0.15, 9)
        wait_for(lambda: book_shows(store, "us-east-1a", 0.15, True) or None, 30, "the new price in the book")
        away_from_review_boundary()
        sky.hold("us-east-1a")
        sky.release("us-west-2b")
        wait_for(lambda: [z for _, z in sky.launches()].count("us-east-1a") or None, 90, "the policy's move")
        wait_for(lambda: len(reports(store, job_id)) >= 2 or None, 60, "checkpoints reported from us-west-2b")
        sky.release("us-east-1a")
        wait_for(lambda: (job_row(store, job_id).attempt >= 2 and job_row(store, job_id).state == "RUNNING")
                 or None, 90, "the job running after its move")
        assert job_row(store, job_id).zones[-1] == "us-east-1a"

        # --- capacity goes from us-east-1a, us-west-2a gets cheaper, and us-east-1a's nodes get a spot notice
        wait_for(lambda: len(reports(store, job_id)) >= 4 or None, 60, "checkpoints reported from us-east-1a")
        market.set("us-east-1a", 0.15, 1)
        market.set("us-west-2a", 0.30, 9)
        sky.refuse("us-east-1a")
        wait_for(lambda: (book_shows(store, "us-east-1a", 0.15, False) and book_shows(store, "us-west-2a", 0.30, True))
                 or None, 30, "capacity and prices in the book")
        away_from_review_boundary()
        chosen = cheapest_with_capacity(store, {"us-east-1a"})
        sky.hold(chosen)
        noticed = next(name for name, c in sky.clusters.items() if c.zone == "us-east-1a")
        sky.notice(noticed)
        wait_for(lambda: [z for _, z in sky.launches()][-1] == chosen or None, 60, "the replacement's launch")

        # --- the leader dies mid-migration; the other replica takes over and finishes it
        dying = leader(replicas)
        assert dying is not None
        dying.process.send_signal(signal.SIGKILL)
        dying.process.wait()
        killed_in = str(job_row(store, job_id).state)
        survivor = wait_for(lambda: leader(replicas), 60, "the other replica to lead")
        sky.release(chosen)
        wait_for(lambda: (job_row(store, job_id).attempt >= 3 and job_row(store, job_id).state == "RUNNING")
                 or None, 120, "the job running on the replacement")
        assert job_row(store, job_id).zones[-1] == chosen

        # --- in-cluster preemption: spot capacity goes everywhere; an urgent job takes the cluster
        wait_for(lambda: len(reports(store, job_id)) >= 6 or None, 60, "checkpoints reported on the replacement")
        for zone in ("us-east-1b", "us-west-2a", "us-west-2b"):
            market.set(zone, {"us-east-1b": 0.20, "us-west-2a": 0.30, "us-west-2b": 0.40}[zone], 1)
        wait_for(lambda: not any((q.capacity_score or 0) >= 4 for q in PriceBook(store).latest()) or None, 30,
                 "no spot capacity in the book")
        away_from_review_boundary()
        urgent_file = tmp_path / "urgent.yaml"
        urgent_file.write_text(URGENT)
        urgent = subprocess.run([sys.executable, "-m", "broker", "launch", str(urgent_file), "--server",
                                 survivor.url, "--detach"], cwd=ROOT, capture_output=True, text=True,
                                env={**os.environ, "BROKER_TOKEN": token, "BROKER_HOME": str(broker_home)},
                                timeout=120)
        assert urgent.returncode == 0, urgent.stderr
        urgent_id = re.search(r"submitted (j-[0-9a-f]+)", urgent.stdout).group(1)  # type: ignore[union-attr]
        wait_for(lambda: (job_row(store, job_id).attempt >= 4 and job_row(store, job_id).state == "RUNNING")
                 or None, 120, "the preempted job running again")
        wait_for(lambda: job_row(store, urgent_id).state == "SUCCEEDED" or None, 120, "the urgent job")
        final = str(wait_for(lambda: job_row(store, job_id).state in ("SUCCEEDED", "FAILED")
                         and job_row(store, job_id).state, 200, "the job to finish"))
        wait_for(lambda: not sky.clusters or None, 60, "every cluster torn down")
        time.sleep(2)  # the last ledger minutes
        elapsed = time.time() - began
        check_run(store, sky, job_id, urgent_id, final, killed_in, chosen, first, survivor, elapsed)
    finally:
        for replica in replicas:
            replica.stop()
        balancer.stop()
        sky.stop()
        aws.stop()
        moto.stop()
        store.dispose()


def steps_of(log: Path) -> tuple[int | None, list[int]]:
    """(the step an attempt resumed at, the steps it ran) from rank 0's output."""
    text = log.read_text(errors="replace")
    resumed = re.search(r"resumed from \S+ at step (\d+)", text)
    return (int(resumed.group(1)) if resumed else None), [int(m) for m in re.findall(r"^step (\d+) loss", text, re.M)]


def check_run(store: Any, sky: SkyStandIn, job_id: str, urgent_id: str, final: str, killed_in: str, chosen: str,
              first: Replica, survivor: Replica, elapsed: float) -> None:
    job = job_row(store, job_id)
    with store.transaction() as s:
        allocations = list(s.scalars(select(AllocationRow).where(AllocationRow.job_id == job_id)
                                     .order_by(AllocationRow.attempt)))
        clusters = {c.id: c for c in s.scalars(select(ClusterRow))}
        ledger = list(s.scalars(select(LedgerRow)))
        (urgent_alloc,) = s.scalars(select(AllocationRow).where(AllocationRow.job_id == urgent_id))
        s.expunge_all()
    reported = reports(store, job_id)
    print(f"job {job_id}: {final} after {elapsed:.0f} s; zones {job.zones}; killed while {killed_in}; "
          f"{len(reported)} checkpoints reported; {len(ledger)} ledger rows")
    assert final == "SUCCEEDED"
    assert first is not survivor
    assert killed_in in ("CHECKPOINTING", "MIGRATING")
    assert job.zones[:3] == ["us-west-2b", "us-east-1a", chosen] and chosen == "us-west-2a"
    reasons = [a.outcome for a in allocations]
    print("attempts:", [(a.attempt, clusters[a.cluster_id].zone, "spot" if clusters[a.cluster_id].spot else "on-demand",
                         a.outcome) for a in allocations])
    assert len(allocations) == 4, reasons
    # The urgent job took the GPUs of the job's third cluster, inside that cluster.
    assert urgent_alloc.cluster_id == allocations[2].cluster_id and allocations[2].outcome == "preempted"

    # Each start after the first resumed from a checkpoint an agent reported and ran on from the step
    # after it: no step before that checkpoint ran again.
    execs = {task["name"]: task for call, _, task in sky.calls if call == "exec" and task["name"].startswith(job_id)}
    steps_reported = {r.step for r in reported}
    ran: list[int] = []
    for attempt in range(1, 5):
        (log,) = sky.job_logs(f"{job_id}-{attempt}")
        resumed, steps = steps_of(log)
        given = execs[f"{job_id}-{attempt}"]["envs"]["BROKER_RESUME_FROM"]
        print(f"attempt {attempt}: resumed at {resumed} ({given or 'fresh'}), ran steps {steps[0]}-{steps[-1]}")
        if attempt == 1:
            assert resumed is None and given == "" and steps[0] == 1
        else:
            assert resumed is not None and given.endswith(f"/train/step-{resumed:06d}.npz")
            assert resumed in steps_reported and steps[0] == resumed + 1 and resumed <= max(ran)
            ran = [x for x in ran if x <= resumed]
        ran += steps
    assert ran == list(range(1, STEPS + 1))

    # The ledger's prices are the price book's, minute by minute.
    book = PriceBook(store)
    for row in ledger:
        quote = book.quote_at(OfferKey(row.cloud, row.region, row.zone, row.instance_type), row.minute)
        assert quote is not None
        expected = quote.spot_price if row.spot else quote.on_demand_price
        assert row.price_per_node_hour == pytest.approx(expected), (row.zone, row.minute)
    assert job_id in {row.job_id for row in ledger}
    assert not clusters or all(c.state in ("TERMINATED", "FAILED") for c in clusters.values())
