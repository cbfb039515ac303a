"""What every engine module is given: options from the settings, the policies they name, the spec cache,
job events as JSON holds them, and the provisioner calls made after commit, in order, behind the lease."""

from __future__ import annotations

import dataclasses
import logging
import math
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select

from broker.backends.base import ClusterInfo, JobLaunch
from broker.backends.fenced import FencedProvisioner
from broker.backends.local.provisioner import LocalProvisioner, LocalWorld
from broker.config.settings import load_settings
from broker.engine import parts as engine_parts
from broker.engine.parts import CLOUD_RESTART_OVERHEAD_S, AfterCommit, EngineOptions, jsonable
from broker.spec.job import parse_job_spec
from broker.store import Store, open_store
from broker.store.db import Fence, Fenced
from broker.store.tables import JobEventRow, JobRow
from policies import kinds
from policies.gang import GangPlacement
from policies.registry import UnknownPolicy
from tests.broker.engine.store_rows import JOB, T0, get, make_parts, new_cluster, stopped_clock, submitted


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    opened = open_store(f"sqlite:///{tmp_path / 'store.db'}")
    yield opened
    opened.dispose()


# ----------------------------------------------------------------------------- options from the settings


@pytest.mark.parametrize(("overrides", "expected"), [
    ({"backend": "local"}, 120.0 + 60.0),  # the local backend's boot time plus a minute
    ({"backend": "local", "local_provision_seconds": 30.0}, 90.0),
    ({"backend": "skypilot"}, CLOUD_RESTART_OVERHEAD_S),
    ({"backend": "skypilot", "restart_overhead_s": 300.0}, 300.0),  # stated: taken as it is
    ({"backend": "local", "restart_overhead_s": 45.0}, 45.0),
])
def test_the_restart_overhead_is_the_settings_or_what_the_backend_implies(overrides: dict[str, Any],
                                                                          expected: float) -> None:
    assert engine_parts.restart_overhead(load_settings(**overrides)) == expected


def test_a_restart_overhead_set_to_zero_is_zero() -> None:
    assert engine_parts.restart_overhead(load_settings(backend="skypilot", restart_overhead_s=0.0)) == 0.0


def test_engine_options_carry_every_setting_the_engine_reads(broker_home: Path) -> None:
    settings = load_settings(selection_policy="greedy", placement_policy="first_fit",
                             preemption_policy="checkpoint_aware",
                             max_gpus=64, restart_overhead_s=240.0, eager_policy="eager", eager_lead_seconds=30.0,
                             pool_idle_seconds=90.0, queue_max_gpus={"training": 16, "inference": 8},
                             start_retries=5, gpu_idle_below=0.2, gpu_sampler="tests.fakenvml.pynvml:sampler")
    options = engine_parts.engine_options(settings, "http://127.0.0.1:8765", checkpoint_gb=12.5)
    assert options == EngineOptions(
        home=settings.home, selection_policy="greedy", placement_policy="first_fit",
        preemption_policy="checkpoint_aware",
        broker_url="http://127.0.0.1:8765", restart_overhead_s=240.0, checkpoint_gb=12.5, max_gpus=64,
        start_retries=5, eager_policy="eager", eager_lead_s=30.0, pool_idle_s=90.0,
        queue_max_gpus=(("inference", 8), ("training", 16)), gpu_idle_below=0.2,
        gpu_sampler="tests.fakenvml.pynvml:sampler")
    assert options.home == broker_home


def test_the_gpu_sampler_setting_reaches_every_node_of_the_job_unless_its_envs_name_another() -> None:
    """Set in the config file it is not in the broker's environment: the launch carries it to the agents."""
    spec = parse_job_spec("name: j\nresources:\n  accelerators: A100:2\nrun: 'true'\n", offline=True)
    placement = GangPlacement("c", ((0, (0,)), (1, (1,))))

    def launch(sampler: str | None, envs: dict[str, str]) -> JobLaunch:
        return JobLaunch("j", 1, dataclasses.replace(spec, envs=envs), placement, "/c", None, None, "/l",
                         gpu_sampler=sampler)

    ips = ["10.0.0.1", "10.0.0.2"]
    assert [launch("m:f", {}).env(rank, ips)["BROKER_GPU_SAMPLER"] for rank in (0, 1)] == ["m:f", "m:f"]
    assert launch("m:f", {"BROKER_GPU_SAMPLER": "mine:reader"}).env(0, ips)["BROKER_GPU_SAMPLER"] == "mine:reader"
    assert "BROKER_GPU_SAMPLER" not in launch(None, {}).env(0, ips)  # unset: the agents read NVML


def test_the_idle_threshold_reaches_every_node_of_the_job_and_its_envs_cannot_change_it() -> None:
    """The agents count the samples below the broker's ``gpu_idle_below``: the job cannot set its own accounting."""
    spec = parse_job_spec("name: j\nresources:\n  accelerators: A100:2\nrun: 'true'\n", offline=True)
    placement = GangPlacement("c", ((0, (0,)), (1, (1,))))
    launch = JobLaunch("j", 1, dataclasses.replace(spec, envs={"BROKER_GPU_IDLE_BELOW": "0"}), placement, "/c", None,
                       None, "/l", gpu_idle_below=0.25)
    assert [launch.env(rank, ["a", "b"])["BROKER_GPU_IDLE_BELOW"] for rank in (0, 1)] == ["0.25", "0.25"]


def test_defaults_give_the_registrys_policies_and_no_limits(broker_home: Path) -> None:
    options = engine_parts.engine_options(load_settings(), None)
    assert (options.selection_policy, options.max_gpus, options.queue_max_gpus, options.pool_idle_s,
            options.broker_url, options.start_retries) == (None, None, (), 0.0, None, 2)


# ----------------------------------------------------------------------------- Parts


def test_parts_take_the_policies_the_options_name(store: Store, broker_home: Path) -> None:
    named = make_parts(store, broker_home, selection_policy="greedy", placement_policy="first_fit",
                       eager_policy="eager")
    assert (named.selection, named.placement, named.eager) == (
        kinds.selection.get("greedy"), kinds.placement.get("first_fit"), kinds.eager.get("eager"))
    default = make_parts(store, broker_home)
    assert (default.selection, default.placement, default.preemption, default.eager) == (
        kinds.selection.get("broker"), kinds.placement.get("topology"),
        kinds.preemption.get("checkpoint_aware"), kinds.eager.get("off"))


@pytest.mark.parametrize(("option", "name", "says"), [
    ("selection_policy", "no-such-policy", "unknown selection policy"),
    ("placement_policy", "no-such-policy", "unknown placement policy"),
    ("preemption_policy", "no-such-policy", "unknown preemption policy"),
    ("eager_policy", "no-such-policy", "unknown eager policy"),
    ("selection_policy", "optimal", "runs only in `broker simulate`"),  # it needs the future
])
def test_parts_refuse_a_policy_a_live_engine_cannot_use(store: Store, broker_home: Path, option: str, name: str,
                                                        says: str) -> None:
    with pytest.raises(UnknownPolicy, match=says):
        options: dict[str, Any] = {option: name}
        make_parts(store, broker_home, **options)


def test_a_remembered_spec_is_the_one_used_and_another_is_read_back_from_the_store(store: Store,
                                                                                   broker_home: Path) -> None:
    parts = make_parts(store, broker_home)
    job_id = submitted(store, broker_home, JOB.replace("name: train", "name: stored"))
    given = parse_job_spec(JOB.replace("name: train", "name: given"), offline=True)
    parts.remember(job_id, given)
    with store.transaction() as s:
        job = get(s, JobRow, job_id)
        assert parts.spec_of(job) is given
    other = submitted(store, broker_home, JOB.replace("name: train", "name: stored"))
    fresh = make_parts(store, broker_home)  # an engine started after a restart knows nothing yet
    with store.transaction() as s:
        job = get(s, JobRow, other)
        spec = fresh.spec_of(job)
        assert (spec.name, spec.num_nodes, spec.gpus_per_node, spec.run) == ("stored", 1, 4, "python train.py")
        job.spec = {"garbage": True}  # cached: not parsed again
        assert fresh.spec_of(job) is spec


def test_an_event_is_stamped_with_the_market_clock_and_held_as_json(db_url: str, broker_home: Path) -> None:
    store = open_store(db_url)
    try:
        parts = make_parts(store, broker_home)
        job_id = submitted(store, broker_home)
        with store.transaction() as s:
            parts.event(s, job_id, "moving", to="us-east-1b", gain=math.inf, loss=-math.inf, score=math.nan,
                        at=T0 + timedelta(minutes=3), gpus=[0, 1], skipped=None)
            parts.event(s, None, "nobody")  # no job: nothing to record
        with store.transaction() as s:
            rows = list(s.scalars(select(JobEventRow).where(JobEventRow.kind != "submitted")))
            assert [(r.job_id, r.kind, r.at) for r in rows] == [(job_id, "moving", T0)]
            assert rows[0].detail == {"to": "us-east-1b", "gain": "inf", "loss": "-inf", "score": "nan",
                                      "at": "2026-01-01T12:03:00+00:00", "gpus": [0, 1]}
    finally:
        store.dispose()


def test_jsonable_leaves_json_values_as_they_are() -> None:
    detail: dict[str, object] = {"n": 3, "x": 2.5, "s": "a", "b": False, "l": [1, "b"], "d": {"k": None}, "z": 0}
    assert jsonable(detail) == detail
    assert jsonable({"gone": None}) == {}


def test_cluster_info_is_the_row_as_the_backend_sees_it() -> None:
    row = new_cluster("c1", num_nodes=2, spot=False, handle={"metadata_port": 1234})
    info = engine_parts.cluster_info(row, "secret")
    assert info == ClusterInfo("c1", "aws", "us-east-1", "us-east-1a", "p3.8xlarge", 2, 4, False, "secret",
                               {"metadata_port": 1234})
    info.handle["changed"] = True
    assert row.handle == {"metadata_port": 1234}  # a copy: the backend cannot write the row
    assert engine_parts.cluster_info(row).agent_token is None


# ----------------------------------------------------------------------------- AfterCommit


class _Lease:
    """The leader lease as its holder sees it: held until let go."""

    def __init__(self) -> None:
        self.held = True
        self.fence = Fence("engine", "test-holder", 7, lambda: self.held)


def _provisioner(home: Path, lease: _Lease) -> FencedProvisioner:
    """The local backend behind the lease check the service's engine uses (no cluster here is ever new)."""
    return FencedProvisioner(LocalProvisioner(home, LocalWorld("no-trace.csv", stopped_clock())), lease.fence.ensure)


def _info(cluster_id: str) -> ClusterInfo:
    return engine_parts.cluster_info(new_cluster(cluster_id))


def _launch(cluster_id: str) -> JobLaunch:
    return JobLaunch("j1", 1, parse_job_spec(JOB, offline=True), GangPlacement.whole_nodes(cluster_id, 1, 4),
                     "/ckpt/j1", None, None, "/tmp/logs")


def test_the_calls_are_made_in_order_and_a_failed_start_goes_to_its_handler(broker_home: Path,
                                                                            caplog: pytest.LogCaptureFixture) -> None:
    lease = _Lease()
    provisioner = _provisioner(broker_home, lease)
    launched = broker_home / "local" / "clusters" / "e"
    launched.mkdir(parents=True)
    (launched / "cluster.json").write_text("{}")  # launched before: launching again starts nothing
    terminated = broker_home / "local" / "clusters" / "a"
    terminated.mkdir(parents=True)
    after = AfterCommit(terminations=[_info("a")], signals=[(_info("b"), "j1", 1, "SIGUSR1")],
                        stops=[(_info("c"), "j1", 1)], prepare_stops=[(_info("d"), "j1", 2)],
                        launches=[_info("e")], prepares=[(_info("f"), _launch("f"))],
                        starts=[(_info("g"), _launch("g")), (_info("h"), _launch("h"))])
    failed: list[tuple[str, str, str]] = []
    with caplog.at_level(logging.DEBUG):
        after.carry_out(provisioner, lambda info, launch, exc: failed.append((info.id, launch.job_id, str(exc))))
    calls = [tuple(r.getMessage().split()[2:]) for r in caplog.records if r.name == "broker.backends.fenced"]
    assert calls == [("terminate", "a"), ("signal_job", "b"), ("stop_job", "c"), ("stop_prepare", "d"),
                     ("launch", "e"), ("prepare_job", "f"), ("start_job", "g"), ("start_job", "h")]
    assert (terminated / "terminate").exists()
    # Neither f, g nor h is up: the early setup's failure is only logged, each start's goes to the handler.
    warnings = [r.getMessage() for r in caplog.records if r.name == "broker.engine" and r.levelno == logging.WARNING]
    assert warnings[0] == "early setup of j1 on f failed to begin: cluster f is not UP"
    assert failed == [("g", "j1", "cluster g is UNKNOWN, not UP"), ("h", "j1", "cluster h is UNKNOWN, not UP")]


def test_a_failed_start_without_a_handler_is_raised(broker_home: Path) -> None:
    provisioner = _provisioner(broker_home, _Lease())
    with pytest.raises(RuntimeError, match="cluster g is UNKNOWN, not UP"):
        AfterCommit(starts=[(_info("g"), _launch("g"))]).carry_out(provisioner)


@pytest.mark.parametrize("which", ["prepares", "starts"])
def test_a_lost_lease_stops_the_calls_and_is_never_handled_as_a_failure(broker_home: Path, which: str) -> None:
    lease = _Lease()
    provisioner = _provisioner(broker_home, lease)
    lease.held = False
    failed: list[str] = []
    after = AfterCommit(**{which: [(_info("g"), _launch("g"))]})  # type: ignore[arg-type]
    with pytest.raises(Fenced, match="epoch 7 is no longer held by test-holder"):
        after.carry_out(provisioner, lambda info, launch, exc: failed.append(info.id))
    assert failed == []


def test_nothing_decided_makes_no_call(broker_home: Path, caplog: pytest.LogCaptureFixture) -> None:
    lease = _Lease()
    provisioner = _provisioner(broker_home, lease)
    lease.held = False  # any call at all would raise
    with caplog.at_level(logging.DEBUG):
        AfterCommit().carry_out(provisioner)
    assert not [r for r in caplog.records if r.name == "broker.backends.fenced"]
