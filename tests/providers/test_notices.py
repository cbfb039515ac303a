from __future__ import annotations

import logging
from datetime import UTC, datetime

import pytest

from providers.notices import AwsImdsReader
from tests.imds import FakeImds, imds_server


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


@pytest.mark.parametrize("garbage", [b"<html>oops</html>", b"[1, 2]", b'{"action": "terminate"}'])
def test_garbage_is_no_notice_and_one_warning(garbage: bytes, caplog: pytest.LogCaptureFixture) -> None:
    state = FakeImds()
    state.action = garbage
    with imds_server(state) as url, caplog.at_level(logging.WARNING):
        reader = AwsImdsReader(url)
        assert reader.poll() == []
        assert reader.poll() == []
    assert len([r for r in caplog.records if r.levelno == logging.WARNING]) == 1


def test_unreachable_metadata_service_is_no_notice(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING):
        assert AwsImdsReader("http://127.0.0.1:9", timeout=0.5).poll() == []
    assert "unreachable" in caplog.text or "token" in caplog.text
