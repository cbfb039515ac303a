"""Where `--server` requests go, read without the full settings model: flag, then environment, then file."""

from __future__ import annotations

from pathlib import Path

import pytest

from broker.cli.app import UsageError
from broker.cli.remote import server_settings


@pytest.fixture(autouse=True)
def _clean(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    for name in ("BROKER_SERVER", "BROKER_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("BROKER_HOME", str(tmp_path / "home"))


def test_flag_then_environment_then_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    config = tmp_path / "broker.yaml"
    config.write_text("server: http://from-file:1\ntoken: file-token\nspeed: 60\n")
    assert server_settings(None, None) is None  # nothing named: the embedded broker
    served = server_settings(config, None)
    assert served is not None and (served.url, served.token) == ("http://from-file:1", "file-token")
    monkeypatch.setenv("BROKER_SERVER", "http://from-env:2")
    monkeypatch.setenv("BROKER_TOKEN", "env-token")
    served = server_settings(config, None)
    assert served is not None and (served.url, served.token) == ("http://from-env:2", "env-token")
    served = server_settings(config, "http://from-flag:3")
    assert served is not None and served.url == "http://from-flag:3"


@pytest.mark.parametrize("text, expected", [
    ("server: [1, 2\n", "not valid YAML"),
    ("- server\n", "expected a mapping of settings"),
    ("server: 42\n", "server: expected a string, got int"),
    ("server: " + "[" * 5000 + "\n", "nested too deeply"),
    ("server: \"http://a\x00b\"\n", "not text"),
])
def test_a_bad_settings_file_is_one_line(tmp_path: Path, text: str, expected: str) -> None:
    config = tmp_path / "broker.yaml"
    config.write_text(text)
    with pytest.raises(UsageError) as caught:
        server_settings(config, None)
    assert expected in str(caught.value) and "\n" not in str(caught.value) and len(str(caught.value)) < 400


def test_binary_and_missing_files_and_huge_urls(tmp_path: Path) -> None:
    binary = tmp_path / "broker.yaml"
    binary.write_bytes(b"\xff\xfe\x00server")
    with pytest.raises(UsageError, match="not text"):
        server_settings(binary, None)
    with pytest.raises(UsageError, match="no such file"):
        server_settings(tmp_path / "absent.yaml", None)
    with pytest.raises(UsageError, match="at most 2048 characters"):
        server_settings(None, "http://" + "a" * 5000)


def test_a_huge_settings_file_is_refused_unread(tmp_path: Path) -> None:
    config = tmp_path / "broker.yaml"
    config.write_text("# " + "x" * (2 << 20) + "\nserver: http://a\n")
    with pytest.raises(UsageError, match="larger than 1048576 bytes"):
        server_settings(config, None)


def test_status_finds_the_store_as_the_settings_model_does(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from broker.cli.jobs import store_url
    from broker.config.settings import load_settings

    config = tmp_path / "broker.yaml"
    monkeypatch.delenv("BROKER_DB_URL", raising=False)
    for text in ("speed: 60\n", f"home: {tmp_path / 'elsewhere'}\n", "db_url: sqlite:////tmp/x.db\n"):
        config.write_text(text)
        assert store_url(config) == load_settings(config).database_url, text
    monkeypatch.setenv("BROKER_DB_URL", "postgresql://u@h/db")
    assert store_url(config) == load_settings(config).database_url == "postgresql://u@h/db"
