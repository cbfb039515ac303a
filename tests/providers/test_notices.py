from __future__ import annotations

import logging
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta

import pytest

from providers.aws import AwsImdsReader
from providers.azure import AzureScheduledEventsReader
from providers.gcp import GcpMetadataReader
from providers.notices import NodeNotice, reader_for
from tests.cloud_metadata import FakeAzureImds, FakeGce, FakeImds, azure_server, gce_server, imds_server


def test_no_notice_until_one_is_posted() -> None:
    state = FakeImds()
    with imds_server(state) as url:
        reader = AwsImdsReader(url)
        assert reader.poll() == []
        state.action = {"action": "terminate", "time": "2026-11-21T10:00:00Z"}
        notices = reader.poll()
    assert [(n.kind, n.action_time) for n in notices] == [("terminate", datetime(2026, 11, 21, 10, tzinfo=UTC))]
    assert state.token_requests == 1  # the session token is reused


def test_rejected_token_is_replaced_once() -> None:
    state = FakeImds()
    state.action = {"action": "stop", "time": "2026-11-21T10:00:00Z"}
    with imds_server(state) as url:
        reader = AwsImdsReader(url)
        assert reader.poll()[0].kind == "stop"
        state.reject_next_get = True
        assert reader.poll()[0].kind == "stop"
    assert state.token_requests == 2


def test_rebalance_recommendation_is_read() -> None:
    state = FakeImds()
    state.rebalance = {"noticeTime": "2026-11-21T09:58:00Z"}
    with imds_server(state) as url:
        notices = AwsImdsReader(url).poll()
    assert [n.kind for n in notices] == ["rebalance"]


@pytest.mark.parametrize("garbage", [
    b"<html>oops</html>", b"[1, 2]", b'{"action": "terminate"}',
    b'{"action": "terminate", "time": 1763719200}',  # a number, not a time
    b"[" * 100_000 + b"]" * 100_000,  # nested deeper than the JSON parser goes
    b'{"action": "terminate", "time": "2026-11-21T10:00:00Z", "x": "' + b"a" * 10_000 + b'", "action": 7}',
])
def test_garbage_is_no_notice_and_one_warning(garbage: bytes, caplog: pytest.LogCaptureFixture) -> None:
    state = FakeImds()
    state.action = garbage
    with imds_server(state) as url, caplog.at_level(logging.WARNING):
        reader = AwsImdsReader(url)
        assert reader.poll() == []
        assert reader.poll() == []
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and len(warnings[0].getMessage()) < 300 and warnings[0].exc_info is None


def test_unreachable_metadata_service_is_no_notice(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING):
        assert AwsImdsReader("http://127.0.0.1:9", timeout=0.5).poll() == []
    assert "unreachable" in caplog.text or "token" in caplog.text


# --- GCP: instance/preempted and instance/maintenance-event, watched with wait_for_change -------

def _poll_until(reader: GcpMetadataReader, predicate: Callable[[list[NodeNotice]], bool],
                timeout: float = 5.0) -> list[NodeNotice]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        notices = reader.poll()
        if predicate(notices):
            return notices
        time.sleep(0.02)
    raise AssertionError("the reader never saw it")


def test_gcp_no_notice_then_preemption_through_wait_for_change() -> None:
    state = FakeGce()
    with gce_server(state) as url:
        reader = GcpMetadataReader(url, wait_seconds=30)
        try:
            assert reader.poll() == []
            _poll_until(reader, lambda _: state.waits >= 2)  # both values now hang on wait_for_change
            assert reader.poll() == []
            flipped = datetime.now(UTC)
            state.set("preempted", "TRUE")
            (notice,) = _poll_until(reader, bool)
        finally:
            reader.close()
    assert notice.kind == "terminate"
    assert notice.action_time is not None
    assert timedelta(seconds=29) < notice.action_time - flipped < timedelta(seconds=32)


def test_gcp_hanging_wait_for_change_never_blocks_poll() -> None:
    state = FakeGce()
    with gce_server(state) as url:
        reader = GcpMetadataReader(url, wait_seconds=30)
        try:
            _poll_until(reader, lambda _: state.waits >= 2)
            started = time.monotonic()
            for _ in range(20):
                reader.poll()
            took = time.monotonic() - started
        finally:
            reader.close()
    assert took < 10  # twenty polls while the server holds both requests open for 30 s: none waited on them


def test_gcp_host_maintenance_is_a_notice_and_live_migration_is_not() -> None:
    state = FakeGce()
    with gce_server(state) as url:
        reader = GcpMetadataReader(url, wait_seconds=30)
        try:
            _poll_until(reader, lambda _: state.waits >= 2)
            state.set("maintenance-event", "MIGRATE_ON_HOST_MAINTENANCE")
            _poll_until(reader, lambda _: state.waits >= 3)
            assert reader.poll() == []
            state.set("maintenance-event", "TERMINATE_ON_HOST_MAINTENANCE")
            (notice,) = _poll_until(reader, bool)
        finally:
            reader.close()
    assert notice.kind == "maintenance"


def test_gcp_garbage_is_no_notice_and_one_warning(caplog: pytest.LogCaptureFixture) -> None:
    state = FakeGce(raw={"preempted": b"<html>Service Unavailable</html>"})
    with gce_server(state) as url, caplog.at_level(logging.WARNING):
        reader = GcpMetadataReader(url, wait_seconds=1, retry_seconds=0.05)
        try:
            _poll_until(reader, lambda _: reader._watches["preempted"].value is not None)
            for _ in range(5):
                assert reader.poll() == []
                time.sleep(0.05)
        finally:
            reader.close()
    # one warning for the garbage however often it is read (a watch cut off when the server
    # stops may add an "unreachable" one: that is another condition)
    garbage = [r for r in caplog.records if r.levelno == logging.WARNING and "answered" in r.getMessage()]
    assert len(garbage) == 1


# --- Azure: Scheduled Events, Preempt for this VM, StartRequests to acknowledge --------------------

def test_azure_preempt_for_this_vm_only() -> None:
    state = FakeAzureImds(vm_name="node-0")
    with azure_server(state) as url:
        reader = AzureScheduledEventsReader(url)
        assert reader.poll() == []
        state.preempt(["node-1"])
        assert reader.poll() == []  # another VM of the scale set
        state.preempt(["node-0"], not_before="Sat, 21 Nov 2026 10:00:30 GMT")
        (notice,) = reader.poll()
    assert notice.kind == "terminate"
    assert notice.action_time == datetime(2026, 11, 21, 10, 0, 30, tzinfo=UTC)
    assert state.rejected_headers == 0  # every call carried Metadata: true


def test_azure_acknowledgement_posts_start_requests() -> None:
    state = FakeAzureImds(vm_name="node-0")
    with azure_server(state) as url:
        reader = AzureScheduledEventsReader(url)
        event_id = state.preempt(["node-0"])
        (notice,) = reader.poll()
        reader.acknowledge(notice)
        assert reader.poll() == []  # the platform starts the eviction
    assert state.posted == [{"StartRequests": [{"EventId": event_id}]}]


@pytest.mark.parametrize("garbage", [b"<html>oops</html>", b"[1, 2]", b'{"Events": 3}'])
def test_azure_garbage_is_no_notice_and_one_warning(garbage: bytes, caplog: pytest.LogCaptureFixture) -> None:
    state = FakeAzureImds(garbage=garbage)
    with azure_server(state) as url, caplog.at_level(logging.WARNING):
        reader = AzureScheduledEventsReader(url)
        assert reader.poll() == []
        assert reader.poll() == []
    assert len([r for r in caplog.records if r.levelno == logging.WARNING]) == 1


@pytest.mark.parametrize("cloud", ["aws", "gcp", "azure"])
def test_reader_for_each_cloud(cloud: str) -> None:
    reader = reader_for(cloud, "http://127.0.0.1:9")
    assert reader.cloud == cloud
