from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from broker.cli import main
from providers.trace import read_trace
from tests.fakeclouds.market import FakeClouds, fake_clouds


def run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    try:
        main(["prices", *args])
        code = 0
    except SystemExit as exc:
        code = int(exc.code or 0)
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture(scope="module")
def servers() -> Iterator[FakeClouds]:
    with fake_clouds() as clouds:
        yield clouds


@pytest.fixture
def clouds(servers: FakeClouds, monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeClouds]:
    for name, value in servers.environment().items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", "/nonexistent/credentials")
    monkeypatch.setenv("AWS_CONFIG_FILE", "/nonexistent/config")
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    monkeypatch.setenv("BROKER_AWS_REGIONS", "us-east-1,us-west-2")
    monkeypatch.setenv("BROKER_AZURE_REGIONS", "eastus,westeurope")
    monkeypatch.setenv("BROKER_PRICE_RETRY_ATTEMPTS", "3")
    monkeypatch.setenv("BROKER_PRICE_RETRY_BASE_SECONDS", "0.01")
    yield servers
    for server in (servers.aws, servers.gcp, servers.azure):
        server.clear_faults()


@pytest.mark.slow
def test_refresh_fills_the_book_and_the_table_reads_it(clouds: FakeClouds, capsys: pytest.CaptureFixture[str],
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    code, out, err = run(capsys, "--refresh", "--json")
    assert code == 0, err
    data = json.loads(out)
    assert [(p["cloud"], p["status"]) for p in data["polls"]] == [("aws", "ok"), ("gcp", "ok"), ("azure", "ok")]
    quotes = data["quotes"]
    assert {q["cloud"] for q in quotes} == {"aws", "gcp", "azure"}
    per_gpu = [q["price_per_gpu_hour"] for q in quotes]
    assert per_gpu == sorted(per_gpu)
    assert {q["region"] for q in quotes if q["cloud"] == "aws"} == {"us-east-1", "us-west-2"}
    assert "azure: no subscription set" in err and "aws: " in err and " quotes in " in err

    code, out, _ = run(capsys, "--json")  # no polling: straight from the book
    again = json.loads(out)
    assert again["polls"] == []
    assert {(q["zone"], q["instance_type"]) for q in again["quotes"]} == \
        {(q["zone"], q["instance_type"]) for q in quotes}

    from broker.cli.app import console

    monkeypatch.setattr(console, "width", 160)  # a terminal wide enough for every column
    code, out, _ = run(capsys, "--gpu", "h100", "--min-gpus", "8")
    lines = out.splitlines()
    assert lines[0].split()[:4] == ["cloud", "zone", "instance", "type"]
    shown = [float(line.split()[4]) for line in lines[1:]]
    assert shown and shown == sorted(shown)
    assert all("8xH100" in line for line in lines[1:])


@pytest.mark.slow
def test_filters_and_price_modes(clouds: FakeClouds, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(capsys, "--refresh", "--json", "--cloud", "aws,gcp", "--gpu", "H100", "--min-gpus", "8",
                         "--spot", "--max-price", "6")
    assert code == 0, err
    quotes = json.loads(out)["quotes"]
    assert quotes
    for q in quotes:
        assert q["cloud"] in ("aws", "gcp") and q["accelerator"] == "H100" and q["gpus_per_node"] >= 8
        assert q["spot_price"] is not None and q["price_per_gpu_hour"] <= 6
    code, out, _ = run(capsys, "--json", "--on-demand", "--region", "us-east-1")
    quotes = json.loads(out)["quotes"]
    assert {q["region"] for q in quotes} == {"us-east-1"}
    ratios = [q["on_demand_price"] / q["gpus_per_node"] for q in quotes]
    assert ratios == sorted(ratios)


@pytest.mark.slow
def test_a_failing_cloud_keeps_its_quotes_marked_stale(clouds: FakeClouds, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(capsys, "--refresh", "--json")
    assert code == 0, err
    clouds.aws.fail("DescribeSpotPriceHistory", 500, times=None)
    code, out, err = run(capsys, "--refresh", "--json")
    assert code == 0
    data = json.loads(out)
    failed = next(p for p in data["polls"] if p["cloud"] == "aws")
    assert failed["status"] == "failed"
    assert failed["message"].startswith("aws: poll failed after retries (InternalError: ")
    assert failed["message"].endswith("quotes, marked stale")
    assert "Traceback" not in err
    stale = {q["cloud"]: set() for q in data["quotes"]}
    for q in data["quotes"]:
        stale[q["cloud"]].add(q["stale"])
    assert stale == {"aws": {True}, "gcp": {False}, "azure": {False}}


def test_a_cloud_without_credentials_is_skipped_with_one_line(clouds: FakeClouds, monkeypatch: pytest.MonkeyPatch,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.delenv("AWS_ACCESS_KEY_ID")
    monkeypatch.delenv("AWS_SECRET_ACCESS_KEY")
    code, _, err = run(capsys, "--refresh", "--cloud", "aws")
    assert code == 1  # the one cloud asked for could not be polled: the refresh did not happen
    assert err.strip().splitlines()[0] == \
        "aws: no credentials found (environment, ~/.aws or instance role); skipped"
    assert err.strip().splitlines()[-1].startswith("error: --refresh: no cloud could be polled (aws skipped)")
    assert "Traceback" not in err


@pytest.mark.slow
def test_export_trace_of_recorded_polls(clouds: FakeClouds, capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    for _ in range(2):
        code, _, err = run(capsys, "--refresh", "--cloud", "azure", "--json")
        assert code == 0, err
        time.sleep(1.1)  # polls at least a tick apart
    path = tmp_path / "mine.csv.gz"
    code, out, err = run(capsys, "--export-trace", str(path), "--since", "1h", "--tick", "1s", "--cloud", "azure")
    assert code == 0, err
    trace = read_trace(path)
    assert {z.cloud for z in trace.zones} == {"azure"}
    assert trace.tick_seconds == 1.0 and trace.num_ticks >= 2
    assert out.startswith(f"wrote {len(trace.zones) * trace.num_ticks} rows ({len(trace.zones)} zones x ")


@pytest.mark.parametrize(("args", "message"), [
    (["--cloud", "aws,ibm"], "--cloud: unknown cloud 'ibm'; expected a comma-separated list of aws, gcp, azure"),
    (["--since", "7x", "--export-trace", "t.csv"],
     "--since: expected a duration like 7d, 12h, 30m or 90s, at most 3660 days, got '7x'"),
    (["--tick", "0m"], "--tick: expected a duration"),
    (["--since", "9" * 400 + "d", "--export-trace", "t.csv"], "--since: expected a duration"),  # was OverflowError
    (["--tick", "1e400s"], "--tick: expected a duration"),
    (["--spot", "--on-demand"], "--spot and --on-demand: choose one"),
    (["--min-gpus", "0"], "--min-gpus: expected a whole number of GPUs from 1 to 1024, got 0"),
    (["--max-price", "-1"], "--max-price: expected a positive USD price per GPU-hour up to 100000, got -1"),
    (["--gpu", "H1000"], "--gpu: unknown accelerator 'H1000'; expected one of "),
    (["--export-trace", "prices.txt"], "--export-trace prices.txt: expected a .csv or .csv.gz file name"),
    (["--history", "nan"], "--history: expected a duration like 7d, 12h, 30m or 90s, at most 3660 days, got 'nan'"),
    (["--history", "-1d"], "--history: expected a duration"),
    (["--history", "0d"], "--history: expected a duration"),
    (["--history", "91d"], "--history: at most 90d (the clouds keep no more), got '91d'"),
    (["--history", "9" * 39 + "d"], "--history: expected a duration like 7d, 12h, 30m or 90s, at most 3660 days"),
    (["--history", "9" * 5000 + "d"],
     "--history: expected a duration like 7d, 12h, 30m or 90s, at most 3660 days, got '999"),
    (["--history", "7\x00d"], "--history: expected a duration"),
    (["--history", "7d\ud800"], "--history: expected a duration"),
])
def test_bad_input_is_one_line_and_exit_2(args: list[str], message: str, capsys: pytest.CaptureFixture[str],
                                         tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    code, out, err = run(capsys, *args)
    assert code == 2
    assert err.startswith(f"error: {message}")
    assert out == "" and list(tmp_path.iterdir()) in ([], [tmp_path / "broker-home"])


def test_export_with_an_empty_book_is_an_error_and_writes_nothing(capsys: pytest.CaptureFixture[str],
                                                                    tmp_path: Path) -> None:
    path = tmp_path / "none.csv"
    code, _, err = run(capsys, "--export-trace", str(path))
    assert code == 2 and "no quotes with an on-demand price between" in err
    assert not path.exists()


@pytest.mark.slow
def test_refresh_exits_1_with_the_reason_when_every_cloud_failed(clouds: FakeClouds,
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    clouds.aws.fail("DescribeSpotPriceHistory", 500, times=None)
    clouds.gcp.fail("skus", 500, times=None)
    clouds.azure.fail("retail", 500, times=None)
    code, out, err = run(capsys, "--refresh", "--json")
    assert code == 1
    assert [p["status"] for p in json.loads(out)["polls"]] == ["failed", "failed", "failed"]
    last = err.strip().splitlines()[-1]
    assert last == "error: --refresh: no cloud could be polled (aws failed, gcp failed, azure failed); anything " \
                   "shown is from earlier polls"
    assert "Traceback" not in err
    code, _, err = run(capsys, "--refresh", "--cloud", "azure")  # the table form fails the same way
    assert code == 1 and "error: --refresh: no cloud could be polled (azure failed)" in err
    clouds.azure.clear_faults()
    code, _, err = run(capsys, "--refresh", "--cloud", "azure")  # and succeeds once a cloud answers
    assert code == 0, err


def test_a_cloud_whose_sdk_is_not_installed_names_the_extra(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    import sys

    monkeypatch.setenv("BROKER_HOME", str(tmp_path))
    monkeypatch.setitem(sys.modules, "boto3", None)  # how Python marks a module as not importable
    code, _, err = run(capsys, "--refresh", "--cloud", "aws")
    assert code == 1
    lines = err.strip().splitlines()
    assert lines[0] == "aws: the AWS SDK (boto3) is not installed; install the extra: pip install " \
                       "'spot-broker[aws]' (or [all]); skipped"
    assert lines[-1].startswith("error: --refresh: no cloud could be polled")


def test_history_polls_and_backfills_the_clouds_that_keep_one(clouds: FakeClouds, capsys: pytest.CaptureFixture[str]
                                                              ) -> None:
    code, out, err = run(capsys, "--history", "7d", "--cloud", "aws", "--json")
    assert code == 0, err
    assert [(p["cloud"], p["status"]) for p in json.loads(out)["polls"]] == [("aws", "ok")]  # --history polls
    assert "aws: backfilled " in err and " past quotes of 7 days" in err
