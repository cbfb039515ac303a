"""Service logs: JSON lines off a terminal, and no token ever in them."""

from __future__ import annotations

import json
import logging

import pytest

from broker.service.logs import configure_logging


@pytest.fixture
def restore_root_logger() -> object:
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    yield root
    root.handlers[:] = handlers
    root.setLevel(level)


def test_json_lines_without_secrets(restore_root_logger: logging.Logger, capsys: pytest.CaptureFixture[str]) -> None:
    configure_logging("host:1", "INFO", as_json=True)
    api_token = "bkr_" + "x" * 43
    agent_token = "ab" * 32
    log = logging.getLogger("broker.test")
    log.info("submitted with %s", api_token, extra={"event": "submitted"})
    log.warning("agent header Authorization: Bearer %s for %s", agent_token, "c1")
    try:
        raise RuntimeError(f"failed with token {api_token}")
    except RuntimeError:
        log.exception("boom")
    lines = [json.loads(line) for line in capsys.readouterr().err.splitlines()]
    assert [line["level"] for line in lines] == ["info", "warning", "error"]
    assert lines[0] == {"ts": lines[0]["ts"], "level": "info", "logger": "broker.test", "replica": "host:1",
                        "msg": "submitted with ***", "event": "submitted"}
    assert lines[1]["msg"] == "agent header Authorization: *** for c1"
    text = json.dumps(lines)
    assert api_token not in text and agent_token not in text and "RuntimeError" in lines[2]["error"]


def test_plain_lines_on_a_terminal(restore_root_logger: logging.Logger, capsys: pytest.CaptureFixture[str]) -> None:
    configure_logging("host:1", "INFO", as_json=False)
    logging.getLogger("broker.test").info("leader: acquired")
    err = capsys.readouterr().err
    assert err.rstrip().endswith("INFO host:1 broker.test: leader: acquired")
    with pytest.raises(json.JSONDecodeError):
        json.loads(err)
