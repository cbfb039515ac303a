"""The job files of issue 32 on the SkyPilot backend: read as the backend reads them (judged by the
price book first, ``broker.intake.read_job``), then placed by the real engine on the price book with
SkyPilot's API server played by the stand-in (``tests/skystandin``).

- ``{L4, L40, A10G}`` and ``[B100:8, H100:8]``: the choice no cloud sells is dropped with a warning
  naming it, also when the book quotes the others (it used to be kept there, silently);
- the same files with every choice unsold: refused as before, at the first unsold choice;
- ``T4:0.5`` on ``num_nodes: 2``: accepted, placed one share per node on two nodes of one T4 cluster,
  and SkyPilot is asked for the share on every node.
"""

from __future__ import annotations

from datetime import datetime
from pathlib import Path

import pytest
from sqlalchemy import select

from broker.backends.skypilot.provisioner import SkyPilotOptions, SkyPilotProvisioner
from broker.backends.skypilot.runtime import store_specs
from broker.clock import WallClock
from broker.engine import Engine, EngineOptions
from broker.engine.machine import submit_job
from broker.intake import Intake, read_job
from broker.market.book import PriceBook
from broker.market.price_market import PriceBookMarket
from broker.spec.job import AcceleratorChoice, JobSpec, SpecError
from broker.store import Store, open_store
from broker.store.tables import AllocationRow, ClusterRow, JobRow
from broker.tokens import SharedAgentTokens
from providers.base import SpotQuote
from tests.broker.engine.one_zone import run_until
from tests.skystandin.server import SkyStandIn

SETS = "name: infer\nresources:\n  accelerators: {L4, L40, A10G}\nrun: python serve.py\n"
LIST = "name: big\nresources:\n  accelerators: [B100:8, H100:8]\nrun: python train.py\n"
NONE_SOLD = ["name: x\nresources:\n  accelerators: {L40, B100}\nrun: x\n",
             "name: x\nresources:\n  accelerators: [B100:8]\nrun: x\n",
             "name: x\nresources:\n  any_of:\n    - accelerators: L40:1\n    - accelerators: B100:8\nrun: x\n"]
GANG = "name: half\nnum_nodes: 2\nresources:\n  accelerators: T4:0.5\nrun: python serve.py\n"


def _quotes(at: datetime) -> dict[str, list[SpotQuote]]:
    return {
        "aws": [SpotQuote("aws", "us-east-1", "us-east-1a", "g6.xlarge", "L4", 1, 0.35, 0.80, at),
                SpotQuote("aws", "us-east-1", "us-east-1a", "g5.xlarge", "A10G", 1, 0.45, 1.01, at),
                SpotQuote("aws", "us-east-1", "us-east-1a", "p5.48xlarge", "H100", 8, 30.0, 98.3, at)],
        # A 2 x T4 node is cheaper per node than two 1 x T4 ones would be for a half on each of two nodes.
        "gcp": [SpotQuote("gcp", "us-central1", "us-central1-a", "n1-standard-8", "T4", 2, 0.30, 1.05, at)],
    }


@pytest.fixture
def store(tmp_path: Path) -> Store:
    store = open_store(f"sqlite:///{tmp_path / 'broker.db'}")
    book = PriceBook(store)
    now = WallClock().now()
    for cloud, listed in _quotes(now).items():
        book.record(cloud, listed, at=now)
    return store


def _read(text: str, tmp_path: Path, store: Store) -> JobSpec:
    spec = read_job(text, "job.yaml", Intake(tmp_path, "skypilot", offline=True), store)
    assert isinstance(spec, JobSpec)
    return spec


def test_a_choice_no_cloud_sells_is_dropped_with_a_warning_though_the_book_quotes_the_others(
        tmp_path: Path, store: Store) -> None:
    spec = _read(SETS, tmp_path, store)
    assert spec.accelerators == (AcceleratorChoice("L4", 1), AcceleratorChoice("A10G", 1))
    [warning] = spec.warnings
    assert warning.startswith("job.yaml:3: resources.accelerators.L40: 'L40' dropped from the accelerator choices: "
                              "not sold on any of aws, gcp, azure")
    assert warning.endswith("; the job keeps L4:1, A10G:1")
    spec = _read(LIST, tmp_path, store)
    assert spec.accelerators == (AcceleratorChoice("H100", 8),)
    [warning] = spec.warnings
    assert warning.startswith("job.yaml:3: resources.accelerators[0]: 'B100' dropped") and "keeps H100:8" in warning
    # A choice the book has not quoted yet but a cloud sells stays: the pollers may not have reached it.
    spec = _read("name: x\nresources:\n  accelerators: {L4, A100}\nrun: x\n", tmp_path, store)
    assert [a.name for a in spec.accelerators] == ["L4", "A100"] and spec.warnings == ()


@pytest.mark.parametrize("text", NONE_SOLD)
def test_with_every_choice_unsold_the_file_is_refused_as_before(tmp_path: Path, store: Store, text: str) -> None:
    with pytest.raises(SpecError) as caught:
        _read(text, tmp_path, store)
    assert caught.value.field is not None and caught.value.field.startswith("resources.")
    assert "unknown accelerator" in str(caught.value) and "\n" not in str(caught.value)


def _engine(home: Path, store: Store, sky: SkyStandIn) -> Engine:
    provisioner = SkyPilotProvisioner(home, store_specs(store), SkyPilotOptions(refresh_s=0.05), sdk=sky.sdk())
    return Engine(store, WallClock(), PriceBookMarket(PriceBook(store)), provisioner,
                  EngineOptions(home=home, broker_url="http://broker.example:8080"),
                  tokens=SharedAgentTokens(store, home))


def _state(store: Store, job_id: str) -> str | None:
    with store.transaction() as s:
        job = s.get(JobRow, job_id)
        return None if job is None else job.state


def _run_to_the_end(engine: Engine, store: Store, sky: SkyStandIn, job_id: str) -> None:
    run_until(engine, lambda: any(cluster.jobs for cluster in sky.clusters.values()))  # the run is sent after RUNNING
    sky.finish_jobs()
    run_until(engine, lambda: _state(store, job_id) == "SUCCEEDED")


def test_the_set_less_its_unsold_choice_is_launched_on_a_choice_the_book_quotes(
        tmp_path: Path, store: Store, skypilot: SkyStandIn) -> None:
    engine = _engine(tmp_path, store, skypilot)
    job_id = submit_job(store, WallClock(), _read(SETS, tmp_path, store), tmp_path, "skypilot")
    run_until(engine, lambda: _state(store, job_id) == "RUNNING")
    [launched] = skypilot.clusters.values()
    resources = launched.task["resources"]
    assert (resources["instance_type"], resources["use_spot"]) == ("g6.xlarge", True)  # L4, the cheapest
    assert "L40" not in str(resources)
    _run_to_the_end(engine, store, skypilot, job_id)


def test_a_half_t4_per_node_gang_gets_one_share_on_each_of_two_nodes_of_one_cluster(
        tmp_path: Path, store: Store, skypilot: SkyStandIn) -> None:
    spec = _read(GANG, tmp_path, store)
    assert (spec.num_nodes, spec.accelerators, spec.warnings) == (2, (AcceleratorChoice("T4", 1, 0.5),), ())
    engine = _engine(tmp_path, store, skypilot)
    job_id = submit_job(store, WallClock(), spec, tmp_path, "skypilot")
    run_until(engine, lambda: _state(store, job_id) == "RUNNING")
    with store.transaction() as s:
        [cluster] = s.scalars(select(ClusterRow))
        [allocation] = s.scalars(select(AllocationRow).where(AllocationRow.job_id == job_id))
        placed = (cluster.accelerator, cluster.num_nodes, cluster.instance_type)
        gpus, share = dict(allocation.gpus), allocation.gpu_share
    assert placed == ("T4", 2, "n1-standard-8")
    assert sorted(gpus) == ["0", "1"] and all(len(g) == 1 for g in gpus.values()) and share == 0.5
    [launched] = skypilot.clusters.values()
    run_until(engine, lambda: bool(launched.jobs))  # the run is sent after RUNNING
    [task] = [job.task for job in launched.jobs]
    assert task["num_nodes"] == 2 and task["resources"]["accelerators"] == {"T4": 0.5}
    _run_to_the_end(engine, store, skypilot, job_id)
