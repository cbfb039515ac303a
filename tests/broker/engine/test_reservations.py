"""Which queued jobs hold a reservation (the GPUs of a running job, claimed by eager allocation), and
which reservations a job gave up: read from the jobs' events, on SQLite and PostgreSQL."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from broker.engine import reservations
from broker.model import JobState
from broker.store import Store, open_store
from broker.store.tables import JobEventRow
from tests.broker.engine.store_rows import T0, add, new_cluster, new_job


def _opened(url: str) -> Store:
    opened = open_store(url)
    add(opened, new_job("running", JobState.RUNNING, attempt=1), new_job("other", JobState.RUNNING, attempt=3),
        new_cluster("c1", job_id="running"), new_cluster("c2", job_id="other"))
    return opened


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    opened = _opened(f"sqlite:///{tmp_path / 'store.db'}")
    yield opened
    opened.dispose()


@pytest.fixture
def db_store(db_url: str) -> Iterator[Store]:
    """On SQLite and PostgreSQL: the join of jobs and their events, and the events' JSON detail."""
    opened = _opened(db_url)
    yield opened
    opened.dispose()


def _event(job_id: str, kind: str, minute: int = 0, **detail: Any) -> JobEventRow:
    return JobEventRow(job_id=job_id, at=T0 + timedelta(minutes=minute), kind=kind, detail=detail)


def _reserve(job_id: str, cluster: str, minute: int = 0, **detail: Any) -> JobEventRow:
    return _event(job_id, "eager_reserve", minute, cluster=cluster, after_job="running", after_attempt=1, **detail)


def _held(store: Store) -> dict[str, dict[str, Any]]:
    with store.transaction() as s:
        return {job.id: detail for job, detail in reservations.held(s)}


def test_nothing_is_held_before_any_reservation(store: Store) -> None:
    add(store, new_job("launched", JobState.PROVISIONING, target_cluster_id="c1"),
        _event("launched", "launch", cluster="c1"))
    assert _held(store) == {}


def test_a_provisioning_job_heading_to_the_cluster_it_reserved_holds_it(db_store: Store) -> None:
    add(db_store, new_job("next", JobState.PROVISIONING, attempt=0, target_cluster_id="c1"),
        _reserve("next", "c1", attempt=0, reason="predicted to finish in 2 min"))
    assert _held(db_store) == {"next": {"cluster": "c1", "after_job": "running", "after_attempt": 1, "attempt": 0,
                                     "reason": "predicted to finish in 2 min"}}


def test_a_reservation_without_an_attempt_counts_for_the_jobs_current_one(store: Store) -> None:
    add(store, new_job("next", JobState.PROVISIONING, attempt=2, target_cluster_id="c1"), _reserve("next", "c1"))
    assert set(_held(store)) == {"next"}


def test_only_a_provisioning_job_holds_a_reservation(store: Store) -> None:
    others = [s for s in JobState if s is not JobState.PROVISIONING]
    add(store, *(new_job(f"j-{s.value}", s, target_cluster_id="c1") for s in others),
        *(_reserve(f"j-{s.value}", "c1", attempt=0) for s in others))
    assert _held(store) == {}


def test_a_job_that_started_since_or_gave_up_or_heads_elsewhere_holds_nothing(store: Store) -> None:
    add(store,
        new_job("started", JobState.PROVISIONING, attempt=1, target_cluster_id="c1"),  # its attempt moved on
        _reserve("started", "c1", attempt=0),
        new_job("gave-up", JobState.PROVISIONING, target_cluster_id=None), _reserve("gave-up", "c1", attempt=0),
        new_job("moved", JobState.PROVISIONING, target_cluster_id="c2"), _reserve("moved", "c1", attempt=0))
    assert _held(store) == {}


def test_the_latest_reservation_of_a_job_is_the_one_that_counts(db_store: Store) -> None:
    add(db_store, new_job("next", JobState.PROVISIONING, target_cluster_id="c2"),
        _reserve("next", "c1", 0, attempt=0), _reserve("next", "c2", 5, attempt=0, reason="second"))
    assert _held(db_store) == {"next": {"cluster": "c2", "after_job": "running", "after_attempt": 1, "attempt": 0,
                                     "reason": "second"}}
    with db_store.transaction() as s:
        s.add(_reserve("next", "c1", 9, attempt=0))  # reserved back on c1 while the row still heads to c2
    assert _held(db_store) == {}


def test_several_jobs_hold_reservations_at_once(store: Store) -> None:
    add(store, new_job("a", JobState.PROVISIONING, target_cluster_id="c1"),
        new_job("b", JobState.PROVISIONING, target_cluster_id="c2"),
        _reserve("a", "c1", 0, attempt=0), _event("b", "eager_reserve", 1, cluster="c2", after_job="other",
                                                  after_attempt=3, attempt=0))
    held = _held(store)
    assert {job: detail["after_job"] for job, detail in held.items()} == {"a": "running", "b": "other"}


def test_given_up_names_each_running_job_and_attempt_a_reservation_was_given_up_on(db_store: Store) -> None:
    add(db_store, new_job("next"), new_job("else"))
    with db_store.transaction() as s:
        assert reservations.given_up(s, "next") == set()
    add(db_store,
        _event("next", "eager_give_up", 1, cluster="c1", after_job="running", after_attempt=1, overrun_s=90.0),
        _event("next", "eager_give_up", 2, cluster="c2", after_job="other", after_attempt=3),
        _event("next", "eager_give_up", 3, cluster="c1", after_job="running", after_attempt=1),  # again: once
        _event("next", "eager_give_up", 4, cluster="c1", after_job="running"),  # an attempt not written: 0
        _event("next", "eager_give_up", 5),  # no detail: nothing to name
        _event("next", "eager_reserve", 6, cluster="c1", after_job="running", after_attempt=2),
        _event("else", "eager_give_up", 7, cluster="c1", after_job="running", after_attempt=5))
    with db_store.transaction() as s:
        assert reservations.given_up(s, "next") == {("running", 1), ("other", 3), ("running", 0)}
        assert reservations.given_up(s, "else") == {("running", 5)}
        assert reservations.given_up(s, "nothere") == set()
