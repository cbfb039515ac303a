"""Time-based policy changes on a controlled clock: business hours, nights, catch-up, admission."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import select

from broker.config.settings import ConfigError, load_settings
from broker.service.schedule_config import PolicySchedule
from broker.service.timepolicy import admission_check, apply_due_policies, due_overrides, last_fire, queue_of
from broker.store import Store, open_store
from broker.store.tables import JobRow, PolicyOverrideRow

DAY = PolicySchedule(name="business-hours", cron="0 8 * * MON-FRI",
                     queue_priority={"inference": 1000, "training": 300},
                     capacity_share={"inference": 0.75, "training": 0.25})
NIGHT = PolicySchedule(name="off-peak", cron="0 20 * * MON-FRI",
                       queue_priority={"inference": 600, "training": 900},
                       capacity_share={"inference": 0.25, "training": 1.0})
MONDAY = datetime(2026, 3, 2, tzinfo=UTC)  # a Monday


def at(day: int, hour: int, minute: int = 0) -> datetime:
    return MONDAY + timedelta(days=day, hours=hour, minutes=minute)


def _job(store: Store, job_id: str, priority: str | None, state: str = "PENDING", gpus: int = 1) -> None:
    now = at(0, 0)
    spec = {"run": "x", **({"broker": {"priority": priority}} if priority else {})}
    with store.transaction() as s:
        s.add(JobRow(id=job_id, name=job_id, team="t", state=state, priority=500, spec=spec, backend="local",
                     num_nodes=1, gpus_per_node=gpus, checkpoint_dir="/c", created_at=now, updated_at=now,
                     zones=[]))


def _overrides(store: Store) -> dict[str, float]:
    with store.transaction() as s:
        return {r.key: r.value for r in s.scalars(select(PolicyOverrideRow))}


def test_the_schedule_in_force_is_the_one_that_fired_last() -> None:
    assert last_fire(DAY, at(0, 7, 59)) == at(-3, 8)  # Monday before eight: Friday's
    assert last_fire(DAY, at(0, 8)) == at(0, 8)
    assert last_fire(NIGHT, at(5, 10)) == at(4, 20)  # Saturday: still Friday night's
    assert {k: o.schedule for k, o in due_overrides([DAY, NIGHT], at(1, 12)).items()} == {
        "queue_priority:inference": "business-hours", "queue_priority:training": "business-hours",
        "capacity_share:inference": "business-hours", "capacity_share:training": "business-hours"}
    assert due_overrides([DAY, NIGHT], at(1, 21))["capacity_share:training"].value == 1.0


def test_overrides_change_at_eight_and_at_twenty_and_reprioritise_queued_jobs(db_url: str) -> None:
    store = open_store(db_url)
    _job(store, "train", "training")
    _job(store, "serve", "inference")
    _job(store, "plain", None)  # no priority written: the training queue
    _job(store, "done", "training", state="SUCCEEDED")
    # Monday 07:00: Friday night's off-peak values are in force (a leader starting now catches up).
    assert {o.schedule for o in apply_due_policies(store, [DAY, NIGHT], at(0, 7))} == {"off-peak"}
    assert _overrides(store)["queue_priority:training"] == 900
    written = apply_due_policies(store, [DAY, NIGHT], at(0, 8))
    assert {o.key for o in written} == set(DAY.overrides())
    assert _overrides(store)["queue_priority:training"] == 300
    with store.transaction() as s:
        priorities = {j.id: j.priority for j in s.scalars(select(JobRow))}
    assert priorities == {"train": 300, "serve": 1000, "plain": 300, "done": 500}
    assert apply_due_policies(store, [DAY, NIGHT], at(0, 12)) == []  # same fire: nothing rewritten
    apply_due_policies(store, [DAY, NIGHT], at(0, 20))
    assert _overrides(store) == {"queue_priority:inference": 600, "queue_priority:training": 900,
                                 "capacity_share:inference": 0.25, "capacity_share:training": 1.0}
    with store.transaction() as s:
        assert s.get(JobRow, "train").priority == 900  # type: ignore[union-attr]
    # A replica that was down over the weekend catches up to Monday's business hours, not Friday night's.
    apply_due_policies(store, [DAY, NIGHT], at(7, 9))
    assert _overrides(store)["capacity_share:inference"] == 0.75
    store.dispose()


def test_admission_keeps_each_queue_within_its_share(db_url: str) -> None:
    store = open_store(db_url)
    apply_due_policies(store, [DAY, NIGHT], at(0, 9))  # inference 6 of 8 GPUs, training 2
    admit = admission_check(capacity_gpus=8)
    _job(store, "t1", "training", state="RUNNING", gpus=2)
    _job(store, "t2", "training", gpus=1)
    _job(store, "i1", "inference", state="RUNNING", gpus=4)
    _job(store, "i2", "inference", gpus=2)
    _job(store, "i3", "inference", gpus=4)
    with store.transaction() as s:
        decisions = {j.id: admit(s, j) for j in s.scalars(select(JobRow).where(JobRow.state == "PENDING"))}
    assert decisions == {"t2": False, "i2": True, "i3": False}
    apply_due_policies(store, [DAY, NIGHT], at(0, 20))  # off-peak: training may use everything
    with store.transaction() as s:
        assert admit(s, s.get(JobRow, "t2")) is True  # type: ignore[arg-type]
        assert admit(s, s.get(JobRow, "i2")) is False  # type: ignore[arg-type]
    with store.transaction() as s:
        assert admission_check(capacity_gpus=None)(s, s.get(JobRow, "i3")) is True  # type: ignore[arg-type]
    store.dispose()


def test_queue_is_the_priority_class_written() -> None:
    assert queue_of({"broker": {"priority": "inference"}}) == "inference"
    assert queue_of({"broker": {"priority": 100}}) == "batch"
    assert queue_of({"broker": {"priority": 42}}) == "custom"
    assert queue_of({"run": "x"}) == "training"


@pytest.mark.parametrize(
    ("schedule", "message"),
    [
        ({"name": "x", "cron": "0 8 * *", "queue_priority": {"training": 1}}, "five cron fields"),
        ({"name": "x", "cron": "0 8 * * 1-5", "queue_priority": {"training": 1}}, "day names"),
        ({"name": "x", "cron": "0 25 * * MON", "queue_priority": {"training": 1}}, "cron expression"),
        ({"name": "x", "cron": "0 8 * * MON", "capacity_share": {"training": 1.5}}, "between 0 and 1"),
        ({"name": "x", "cron": "0 8 * * MON", "queue_priority": {"gpu": 1}}, "unknown queue 'gpu'"),
        ({"name": "x", "cron": "0 8 * * MON"}, "changes nothing"),
        ({"name": "x", "cron": "0 8 * * MON", "timezone": "Mars/Base", "queue_priority": {"training": 1}},
         "IANA time zone"),
    ],
)
def test_bad_schedules_are_refused_naming_the_field(schedule: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError) as error:
        load_settings(policy_schedules=[schedule])
    assert "policy_schedules.0" in str(error.value) and message in str(error.value)
