"""Broken settings: one line naming the setting or file, exit 2, no traceback."""

from __future__ import annotations

import gzip
import os
from pathlib import Path

import pytest

from broker.cli import main

HEADER = b"time,cloud,region,zone,instance_type,accelerator,gpus_per_node,spot_price,on_demand_price,available_nodes\n"
ROW = b"2024-01-01T00:00:00Z,aws,us-east-1,us-east-1a,p3.2xlarge,V100,1,0.9,3.06,2\n"
# A day of ticks a minute apart, one row each (a trace may hold one row per tick and zone).
DAY_OF_ROWS = b"".join(ROW.replace(b"T00:00:", f"T{m // 60:02d}:{m % 60:02d}:".encode()) for m in range(1440))
JOB = "name: t\nresources:\n  accelerators: V100:1\nrun: 'true'\n"


def _fails(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    captured = capsys.readouterr()
    assert exit_info.value.code == 2, captured.err
    assert "Traceback" not in captured.err + captured.out
    lines = [line for line in captured.err.splitlines() if line.strip()]
    assert len(lines) == 1, captured.err
    return lines[0]


@pytest.mark.parametrize(("content", "words"), [
    (os.urandom(64) + b"\xff\xfe\x00", "not text"),
    (b"\x00\x01\x02 binary", "not text"),
    (b"- just\n- a list\n", "expected a mapping"),
    (b"home: [unclosed\n", "not valid YAML"),
    (b"colour: blue\n", "colour"),
    (b"speed: -1\n", "speed"),
    (b"a: " + b"[" * 20_000 + b"]" * 20_000 + b"\n", "config.yaml"),
    (b"#" * (2 * 1024 * 1024), "larger than"),
], ids=["random-binary", "nul-binary", "list", "yaml-syntax", "unknown-key", "negative-speed", "deep", "huge"])
def test_a_binary_or_wrong_config_file(tmp_path: Path, capsys: pytest.CaptureFixture[str], content: bytes,
                                       words: str) -> None:
    config = tmp_path / "config.yaml"
    config.write_bytes(content)
    line = _fails(["status", "--config", str(config)], capsys)
    assert words in line


@pytest.mark.parametrize(("db_url", "words"), [
    ("not a url", "db_url: Value error, not a database URL"),
    ("mysql://localhost/db", "unsupported database 'mysql'"),
    ("sqlite:///x\x00y", "NUL"),
    ("postgresql://127.0.0.1:1/nothing", "cannot open the store"),
])
def test_a_bad_db_url(tmp_path: Path, capsys: pytest.CaptureFixture[str], db_url: str, words: str) -> None:
    config = tmp_path / "config.yaml"
    config.write_text(f'db_url: "{db_url.replace(chr(0), chr(92) + "0")}"\n')
    assert words in _fails(["status", "--config", str(config)], capsys)


def test_home_that_is_a_file(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                             monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("BROKER_HOME")  # the environment would win over the file
    config = tmp_path / "config.yaml"
    config.write_text("home: /etc/passwd\n")
    line = _fails(["status", "--config", str(config)], capsys)
    assert "home" in line and "/etc/passwd is not a directory" in line


def test_home_that_is_a_file_from_the_environment(capsys: pytest.CaptureFixture[str],
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("BROKER_HOME", "/etc/passwd")
    line = _fails(["status"], capsys)
    assert "/etc/passwd" in line


@pytest.mark.parametrize(("name", "content", "words"), [
    ("fake.csv.gz", b"time,cloud\nthis is not gzip\n", "not gzip data"),
    ("cut.csv.gz", gzip.compress(HEADER + DAY_OF_ROWS)[:-200], "truncated or corrupt gzip"),
    ("binary.csv", os.urandom(256) + b"\xff", "not text"),
    ("nul.csv", HEADER + ROW.replace(b"us-east-1a", b"us-east\x00-1a"), "column zone: a NUL byte"),
    ("nan.csv", HEADER + ROW.replace(b",0.9,", b",NaN,"), "nan.csv:2: column spot_price: expected a non-negative"),
    ("inf.csv", HEADER + ROW.replace(b",3.06,", b",inf,"), "inf.csv:2: column on_demand_price"),
    ("negative.csv", HEADER + ROW.replace(b",2\n", b",-3\n"), "negative.csv:2: column available_nodes"),
    ("huge.csv", HEADER + ROW.replace(b",2\n", b",1e30\n"), "huge.csv:2: column available_nodes"),
    ("far.csv", HEADER + ROW + ROW.replace(b":00Z", b":01Z", 1) + ROW.replace(b"2024-", b"9999-"),
     "column time"),
], ids=["fake-gzip", "truncated-gzip", "binary", "nul", "nan", "inf", "negative-nodes", "huge-nodes", "far-tick"])
def test_a_binary_or_fake_gzip_market_file(tmp_path: Path, capsys: pytest.CaptureFixture[str], name: str,
                                           content: bytes, words: str) -> None:
    market = tmp_path / name
    market.write_bytes(content)
    job = tmp_path / "job.yaml"
    job.write_text(JOB)
    line = _fails(["launch", str(job), "--market", str(market)], capsys)
    assert name in line and words in line


@pytest.mark.parametrize(("name", "value", "words"), [
    ("eager_policy", "eagre", "eager_policy: Value error, unknown eager policy 'eagre'; registered: eager, off"),
    ("eager_policy", "x\x00" * 5000, "unknown eager policy"),
    ("eager_lead_seconds", -1, "eager_lead_seconds: Input should be greater than or equal to 0"),
    ("eager_lead_seconds", float("nan"), "eager_lead_seconds"),
    ("eager_lead_seconds", 10**12, "eager_lead_seconds: Input should be less than or equal to 86400"),
    ("pool_idle_seconds", "soon", "pool_idle_seconds: Input should be a valid number"),
    ("pool_idle_seconds", -5, "pool_idle_seconds"),
    ("start_retries", -1, "start_retries: Input should be greater than or equal to 0"),
    ("start_retries", 10**9, "start_retries: Input should be less than or equal to 100"),
    ("start_retries", "twice\x00", "start_retries: Input should be a valid integer"),
    # The GPU-measurement and capacity-signal settings.
    ("gpu_idle_below", 1.5, "gpu_idle_below: Input should be less than or equal to 1"),
    ("gpu_idle_below", -0.1, "gpu_idle_below: Input should be greater than or equal to 0"),
    ("gpu_idle_below", float("nan"), "gpu_idle_below"),
    ("gpu_idle_below", "idle\ud800", "gpu_idle_below: Input should be a valid"),
    ("gpu_sampler", "os:system; rm -rf /", "gpu_sampler: String should match pattern"),
    ("gpu_sampler", "tests.fakenvml", "gpu_sampler: String should match pattern"),  # no callable
    ("gpu_sampler", "../evil:read", "gpu_sampler: String should match pattern"),
    ("gpu_sampler", "m:f\n", "gpu_sampler: String should match pattern"),
    ("gpu_sampler", "m" * 300 + ":f", "gpu_sampler: String should have at most 200 characters"),
    ("gpu_sampler", 42, "gpu_sampler: Input should be a valid string"),
    ("capacity_request_interval_seconds", float("inf"), "capacity_request_interval_seconds"),
    ("capacity_request_interval_seconds", -1, "capacity_request_interval_seconds"),
    ("capacity_cache_seconds", 10**12, "capacity_cache_seconds: Input should be less than or equal to 86400"),
    ("capacity_cache_seconds", "x" * 100_000, "capacity_cache_seconds: Input should be a valid number"),
    ("gcp_capacity_advice", "maybe", "gcp_capacity_advice: Input should be a valid boolean"),
    ("gcp_capacity_history", "sometimes\x00", "gcp_capacity_history: Input should be a valid boolean"),
    ("price_backfill_days", 91, "price_backfill_days: Input should be less than or equal to 90"),
    ("price_backfill_days", -1, "price_backfill_days: Input should be greater than or equal to 0"),
    ("price_backfill_days", float("nan"), "price_backfill_days"),
    ("price_backfill_days", float("inf"), "price_backfill_days"),
    ("price_backfill_days", "week\ud800", "price_backfill_days: Input should be a valid"),
])
def test_eager_and_pool_settings_refuse_garbage_in_one_line(name: str, value: object, words: str) -> None:
    from broker.config.file import ConfigError
    from broker.config.settings import load_settings

    with pytest.raises(ConfigError) as error:
        load_settings(**{name: value})
    message = str(error.value)
    assert words in message and "\n" not in message and len(message) < 600


@pytest.mark.parametrize(("value", "words"), [
    ({"trainin": 4}, "unknown queue 'trainin'; expected one of inference, training, batch, custom"),
    ({"training": 0}, "training: GPUs must be at least 1, got 0"),
    ({"training": "many"}, "queue_max_gpus.training: Input should be a valid integer"),
    ({"x" * 100_000: 1}, "unknown queue 'xxxxxxxx"),
    ("training=4", "queue_max_gpus: Input should be a valid dictionary"),
])
def test_queue_gpu_limits_refuse_garbage_in_one_line(value: object, words: str) -> None:
    from broker.config.file import ConfigError
    from broker.config.settings import load_settings

    with pytest.raises(ConfigError) as error:
        load_settings(queue_max_gpus=value)
    message = str(error.value)
    assert words in message and "\n" not in message and len(message) < 600


@pytest.mark.parametrize(("argv", "env", "field"), [
    (["launch", "job.yaml", "--speed", "inf"], {}, "speed"),
    (["launch", "job.yaml", "--speed", "1e308"], {}, "speed"),
    (["launch", "job.yaml"], {"BROKER_SPEED": "inf"}, "speed"),
    (["launch", "job.yaml"], {"BROKER_SPEED": "nan"}, "speed"),
    (["launch", "job.yaml"], {"BROKER_POLL_SECONDS": "inf"}, "poll_seconds"),
    (["launch", "job.yaml"], {"BROKER_LOCAL_PROVISION_SECONDS": "inf"}, "local_provision_seconds"),
], ids=["flag-inf", "flag-1e308", "env-inf", "env-nan", "poll-inf", "provision-inf"])
def test_infinite_or_huge_numbers_in_flags_and_settings_are_one_line(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], argv: list[str],
        env: dict[str, str], field: str) -> None:
    """Were tracebacks (an infinite speed or interval overflowed the clock or a sleep)."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("BROKER_HOME", str(tmp_path / "home"))
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    (tmp_path / "job.yaml").write_text(JOB)
    line = _fails(argv, capsys)
    assert field in line
    assert not (tmp_path / "home" / "broker.db").exists()


def test_a_hostile_gpu_sampler_in_the_environment_is_refused_naming_the_setting(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from broker.config.file import ConfigError
    from broker.config.settings import load_settings

    monkeypatch.setenv("BROKER_GPU_SAMPLER", "os:system(\"rm -rf ~\")")
    with pytest.raises(ConfigError) as error:
        load_settings()
    assert str(error.value).startswith("invalid settings: gpu_sampler: String should match pattern")
    monkeypatch.setenv("BROKER_GPU_SAMPLER", "tests.fakenvml.pynvml:nvmlInit")
    assert load_settings().gpu_sampler == "tests.fakenvml.pynvml:nvmlInit"
