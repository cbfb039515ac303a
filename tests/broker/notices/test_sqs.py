"""EventBridge's EC2 spot warnings through a real SQS API (moto's server) into the notice table."""

from __future__ import annotations

import json
import logging
import socket
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import select

from broker.clock import WallClock
from broker.config.settings import load_settings
from broker.notices.record import Notice, record_notice
from broker.notices.sqs import SqsNoticeListener
from broker.store import Store, open_store
from broker.store.tables import ClusterRow, JobRow, NoticeRow

INSTANCES = ["i-0a1b2c3d4e5f60718", "i-0a1b2c3d4e5f60719"]


def interruption(instance_id: str, action: str = "terminate", at: str = "2026-11-21T10:00:00Z") -> str:
    """The event as EventBridge sends it (AWS: "Spot Instance interruption notices")."""
    return json.dumps({
        "version": "0", "id": "12345678-1234-1234-1234-123456789012",
        "detail-type": "EC2 Spot Instance Interruption Warning", "source": "aws.ec2",
        "account": "123456789012", "time": at, "region": "us-east-1",
        "resources": [f"arn:aws:ec2:us-east-1a:instance/{instance_id}"],
        "detail": {"instance-id": instance_id, "instance-action": action},
    })


def rebalance(instance_id: str) -> str:
    return json.dumps({
        "version": "0", "id": "12345678-1234-1234-1234-123456789013",
        "detail-type": "EC2 Instance Rebalance Recommendation", "source": "aws.ec2",
        "account": "123456789012", "time": "2026-11-21T09:58:00Z", "region": "us-east-1",
        "resources": [f"arn:aws:ec2:us-east-1:123456789012:instance/{instance_id}"],
        "detail": {"instance-id": instance_id},
    })


@pytest.fixture(scope="module")
def sqs_endpoint() -> Iterator[str]:
    from moto.server import ThreadedMotoServer

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    yield f"http://127.0.0.1:{port}"
    server.stop()


@pytest.fixture
def listener(db_url: str, sqs_endpoint: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[SqsNoticeListener]:
    import boto3

    for name, value in (("AWS_ACCESS_KEY_ID", "testing"), ("AWS_SECRET_ACCESS_KEY", "testing")):
        monkeypatch.setenv(name, value)
    client = boto3.client("sqs", region_name="us-east-1", endpoint_url=sqs_endpoint)
    queue_url = client.create_queue(QueueName=f"spot-events-{datetime.now().timestamp():.0f}-{id(db_url)}")["QueueUrl"]
    store = open_store(db_url)
    now = datetime.now(UTC)
    with store.transaction() as s:
        s.add(JobRow(id="j1", name="t", team="a", state="RUNNING", priority=500, spec={}, backend="skypilot",
                     num_nodes=2, gpus_per_node=1, checkpoint_dir="/c", created_at=now, updated_at=now, zones=[]))
        s.flush()
        s.add(ClusterRow(id="j1-c1", launch_key="j1:1", job_id="j1", backend="skypilot", cloud="aws",
                         region="us-east-1", zone="us-east-1a", instance_type="p3.2xlarge", gpus_per_node=1,
                         num_nodes=2, spot=True, price_per_node_hour=0.9, on_demand_price_per_node_hour=3.06,
                         state="UP", token_hash="x", handle={"instance_ids": INSTANCES}, created_at=now))
    settings = load_settings(sqs_queue_url=queue_url, sqs_region="us-east-1", sqs_endpoint_url=sqs_endpoint)
    built = SqsNoticeListener.from_settings(store, WallClock(), settings)
    built.wait_seconds = 1
    yield built
    store.dispose()


def _send(listener: SqsNoticeListener, body: str) -> None:
    listener.client.send_message(QueueUrl=listener.queue_url, MessageBody=body)


def _notices(store: Store) -> list[NoticeRow]:
    with store.transaction() as s:
        rows = list(s.scalars(select(NoticeRow).order_by(NoticeRow.id)))
        s.expunge_all()
        return rows


def _left(listener: SqsNoticeListener) -> int:
    attributes = listener.client.get_queue_attributes(QueueUrl=listener.queue_url,
                                                      AttributeNames=["ApproximateNumberOfMessages"])
    return int(attributes["Attributes"]["ApproximateNumberOfMessages"])


def test_interruption_warning_becomes_the_clusters_notice(listener: SqsNoticeListener) -> None:
    _send(listener, interruption(INSTANCES[1]))
    assert listener.poll_once() == 1
    (notice,) = _notices(listener.store)
    assert (notice.cluster_id, notice.kind, notice.source, notice.node) == ("j1-c1", "terminate", "sqs", INSTANCES[1])
    assert notice.dedup_key == "j1-c1:terminate"
    assert notice.action_time is not None
    action = notice.action_time if notice.action_time.tzinfo else notice.action_time.replace(tzinfo=UTC)
    assert action == datetime(2026, 11, 21, 10, 2, tzinfo=UTC)  # two minutes after the warning
    assert _left(listener) == 0


def test_rebalance_recommendation_and_sns_wrapping(listener: SqsNoticeListener) -> None:
    _send(listener, json.dumps({"Type": "Notification", "MessageId": "m1", "Message": rebalance(INSTANCES[0])}))
    listener.poll_once()
    assert [(n.kind, n.source) for n in _notices(listener.store)] == [("rebalance", "sqs")]


def test_agent_first_then_sqs_is_a_no_op(listener: SqsNoticeListener) -> None:
    agent = record_notice(listener.store, WallClock(), Notice(
        cluster_id="j1-c1", node="0", kind="terminate", action_time=datetime.now(UTC) + timedelta(minutes=2)),
        source="agent")
    _send(listener, interruption(INSTANCES[0]))
    listener.poll_once()
    (notice,) = _notices(listener.store)
    assert notice.id == agent.notice_id and notice.source == "agent"
    assert _left(listener) == 0


def test_sqs_first_then_agent_is_a_duplicate(listener: SqsNoticeListener) -> None:
    _send(listener, interruption(INSTANCES[0]))
    listener.poll_once()
    again = record_notice(listener.store, WallClock(), Notice(cluster_id="j1-c1", node="1", kind="terminate"),
                          source="agent")
    assert again.duplicate
    assert [n.source for n in _notices(listener.store)] == ["sqs"]


def test_foreign_instances_and_garbage_are_dropped(listener: SqsNoticeListener,
                                                   caplog: pytest.LogCaptureFixture) -> None:
    _send(listener, interruption("i-0ffffffffffffffff"))
    _send(listener, "<html>not an event</html>")
    with caplog.at_level(logging.WARNING, logger="broker.notices.sqs"):
        while listener.poll_once():
            pass
    assert _notices(listener.store) == []
    assert _left(listener) == 0
    assert len([r for r in caplog.records if r.levelno == logging.WARNING]) == 1


def _event(detail: object, **fields: object) -> str:
    return json.dumps({"version": "0", "detail-type": "EC2 Spot Instance Interruption Warning", "source": "aws.ec2",
                       "time": "2026-11-21T10:00:00Z", "detail": detail, **fields})


LONG_ID = "i-" + "0" * 150  # a node id longer than the notice's column: refused by the notice's own checks

MALFORMED = {
    "deep-nesting": "[" * 100_000 + "]" * 100_000,
    "time-past-the-calendar": interruption(INSTANCES[0], at="9999-12-31T23:59:59Z"),
    "time-out-of-range": interruption(INSTANCES[0], at="2030-13-45T00:00:00Z"),
    "time-without-zone": interruption(INSTANCES[0], at="2026-11-21T10:00:00"),
    "time-a-number": _event({"instance-id": INSTANCES[0]}, time=1763719200),
    "time-year-1": interruption(INSTANCES[0], at="0001-01-01T00:00:00Z"),
    "instance-id-a-list": _event({"instance-id": [INSTANCES[0]]}),
    "instance-id-nul": _event({"instance-id": INSTANCES[0] + "\x00"}),
    "instance-id-too-long": interruption(LONG_ID),
    "detail-type-a-mapping": json.dumps({"detail-type": {"a": 1}, "detail": {}}),
    "sns-message-not-json": json.dumps({"Type": "Notification", "Message": "{not json"}),
    "sns-message-a-number": json.dumps({"Type": "Notification", "Message": 7}),
    "nul-bytes": "\x00" * 1000,
}


@pytest.mark.parametrize("body", list(MALFORMED.values()), ids=list(MALFORMED))
def test_a_malformed_message_is_one_log_line_stores_nothing_and_is_deleted(
        listener: SqsNoticeListener, caplog: pytest.LogCaptureFixture, body: str) -> None:
    with listener.store.transaction() as s:
        cluster = s.get(ClusterRow, "j1-c1")
        assert cluster is not None
        cluster.handle = {"instance_ids": [*INSTANCES, LONG_ID]}
    _send(listener, body)
    with caplog.at_level(logging.INFO, logger="broker.notices.sqs"):
        while listener.poll_once():
            pass
    assert _notices(listener.store) == []
    assert _left(listener) == 0  # handled: deleted, never retried as a poison message
    records = [r for r in caplog.records if r.name == "broker.notices.sqs"]
    assert records and all(r.exc_info is None and r.levelno <= logging.WARNING for r in records)
    assert all("\n" not in r.getMessage() and len(r.getMessage()) < 600 for r in records)


def test_a_message_over_the_sqs_limit_is_not_parsed() -> None:
    from providers.aws import eventbridge_event as parse_event

    assert parse_event(_event({"instance-id": INSTANCES[0]}, padding="a" * 300_000)) is None
    assert parse_event(_event({"instance-id": INSTANCES[0]})) is not None
