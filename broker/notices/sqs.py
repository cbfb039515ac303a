"""EC2 spot warnings from EventBridge, read from an SQS queue and recorded as notices.

An EventBridge rule matching ``EC2 Spot Instance Interruption Warning`` and ``EC2 Instance
Rebalance Recommendation`` (source ``aws.ec2``) with this queue as its target delivers each
event's JSON as a message body (or wrapped in an SNS notification, also understood). The
listener long-polls the queue, maps the event's ``instance-id`` to the broker's cluster through
the instance ids SkyPilot reports for it (kept in the cluster row's ``handle["instance_ids"]``),
and records the notice exactly as an agent's report is recorded: once per ``<cluster>:<kind>``,
so whichever of the agent and SQS comes first wins and the other is a no-op. Messages are
deleted once handled, including those for instances the broker does not run and unreadable ones.
"""

from __future__ import annotations

import logging
import threading
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import select

from broker.clock import Clock
from broker.config.settings import Settings
from broker.errors import BrokerError
from broker.model import ClusterState
from broker.notices.record import Notice, Recorded, record_notice, to_clock, within_years
from broker.store import Store
from broker.store.tables import ClusterRow
from providers.aws import eventbridge_event

log = logging.getLogger("broker.notices.sqs")

INTERRUPTION = "EC2 Spot Instance Interruption Warning"
REBALANCE = "EC2 Instance Rebalance Recommendation"
# EC2 interrupts a spot instance two minutes after the warning.
INTERRUPTION_LEAD = timedelta(minutes=2)


def _region_of(queue_url: str) -> str | None:
    host = queue_url.split("://", 1)[-1].split("/", 1)[0]  # sqs.us-east-1.amazonaws.com
    parts = host.split(".")
    return parts[1] if len(parts) > 2 and parts[0] == "sqs" else None


def shown(value: object, limit: int = 120) -> str:
    """A value from a message, on one bounded line for the log."""
    text = " ".join(str(value).replace("\x00", "\\0").split())
    return text if len(text) <= limit else text[:limit] + "..."


class Malformed(BrokerError, ValueError):
    """An EventBridge event of ours with a field that cannot be what AWS sends."""


def event_time(value: object) -> datetime | None:
    """The event's ``time``: ISO 8601 with a zone, as EventBridge writes it; None when absent."""
    if value is None:
        return None
    if not isinstance(value, str):
        raise Malformed(f"time: expected an ISO 8601 string, got {shown(value, 40)}")
    try:
        sent = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        raise Malformed(f"time: not an ISO 8601 time: {shown(value, 40)}") from None
    if sent.tzinfo is None:
        raise Malformed(f"time: has no time zone: {shown(value, 40)}")
    return sent


class SqsNoticeListener:
    def __init__(self, store: Store, clock: Clock, client: Any, queue_url: str, wait_seconds: int = 20) -> None:
        self.store = store
        self.clock = clock
        self.client = client
        self.queue_url = queue_url
        self.wait_seconds = wait_seconds
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @classmethod
    def from_settings(cls, store: Store, clock: Clock, settings: Settings) -> SqsNoticeListener:
        import boto3

        assert settings.sqs_queue_url is not None
        client = boto3.client("sqs", region_name=settings.sqs_region or _region_of(settings.sqs_queue_url),
                              endpoint_url=settings.sqs_endpoint_url)
        return cls(store, clock, client, settings.sqs_queue_url)

    def cluster_of(self, instance_id: str) -> str | None:
        """The live AWS cluster one of whose nodes is ``instance_id``."""
        with self.store.transaction() as s:
            rows = s.execute(select(ClusterRow.id, ClusterRow.handle).where(
                ClusterRow.cloud == "aws",
                ClusterRow.state.in_([ClusterState.PROVISIONING.value, ClusterState.UP.value,
                                      ClusterState.TERMINATING.value])))
            for cluster_id, handle in rows:
                if instance_id in ((handle or {}).get("instance_ids") or []):
                    return str(cluster_id)
        return None

    def handle(self, body: str) -> Recorded | None:
        """Record the notice a message carries; None when it is not one of ours (or not a valid one)."""
        event = eventbridge_event(body)
        if event is None:
            log.warning("SQS message is not an EventBridge event: %s", shown(body))
            return None
        kind_of = event.get("detail-type")
        if kind_of not in (INTERRUPTION, REBALANCE):
            log.info("ignoring EventBridge event %s", shown(kind_of))
            return None
        detail = event["detail"]
        instance_id = detail.get("instance-id")
        if not isinstance(instance_id, str) or not instance_id:
            log.warning("%s: detail.instance-id: expected an instance id, got %s", kind_of, shown(instance_id, 40))
            return None
        cluster_id = self.cluster_of(instance_id)
        if cluster_id is None:
            log.info("%s for %s: not a node of any live cluster", kind_of, shown(instance_id, 40))
            return None
        try:
            report = self._report(kind_of, event, detail, cluster_id, instance_id)
        except (ValueError, OverflowError) as exc:
            log.warning("%s for %s (cluster %s) refused: %s", kind_of, shown(instance_id, 40), cluster_id,
                        shown(exc, 300))
            return None
        accepted = record_notice(self.store, self.clock, report, source="sqs")
        log.info("%s for %s (cluster %s)%s", kind_of, instance_id, cluster_id,
                 ": already known" if accepted.duplicate else "")
        return accepted

    def _report(self, kind_of: str, event: dict[str, Any], detail: dict[str, Any], cluster_id: str,
                instance_id: str) -> Notice:
        sent = within_years("time", event_time(event.get("time")))
        if kind_of == INTERRUPTION:
            action = str(detail.get("instance-action") or "terminate").lower()
            kind = action if action in ("terminate", "stop", "hibernate") else "terminate"
            action_time = within_years("time", sent + INTERRUPTION_LEAD) if sent else None
        else:
            kind, action_time = "rebalance", None
        said = {"node": instance_id, "noticed_at": sent.isoformat() if sent else None, "signaled_at": None,
                "checkpoint_at": None}
        return Notice(cluster_id, kind, node=instance_id, action_time=to_clock(self.clock, action_time), detail=said)

    def poll_once(self) -> int:
        """One long poll: handle and delete what arrived; returns how many messages came."""
        answer = self.client.receive_message(QueueUrl=self.queue_url, MaxNumberOfMessages=10,
                                             WaitTimeSeconds=self.wait_seconds)
        messages = answer.get("Messages") or []
        for message in messages:
            try:
                self.handle(message.get("Body") or "")
            except Exception as exc:  # the store, most likely: keep the message, retried after its visibility timeout
                log.warning("could not record the notice in SQS message %s: %s: %s", shown(message.get("MessageId")),
                            type(exc).__name__, shown(exc, 300))
                continue
            self.client.delete_message(QueueUrl=self.queue_url, ReceiptHandle=message["ReceiptHandle"])
        return len(messages)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.poll_once()
            except Exception as exc:  # SQS unreachable for a moment: the agents still report
                log.warning("SQS long poll failed: %s", exc)
                self._stop.wait(5.0)

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="sqs-notices", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
