"""``broker simulate`` end to end: flags, the JSON shape, a timeline another program can replay, errors."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from broker.cli import _register, main
from broker.cli.app import app
from tests.markets import trace_text

JOB = """name: tiny
num_nodes: {nodes}
resources:
  accelerators: V100:1
run: python train.py
broker:
  work: {work}
  deadline: {deadline}
"""
ZONES = (("us-east-1a", "us-east-1"), ("us-west-2a", "us-west-2"))


def cli(args: list[str]) -> None:
    _register()
    # A build with only this command registered makes it the whole program (Typer collapses it).
    prefix = ["simulate"] if len(app.registered_commands) + len(app.registered_groups) > 1 else []
    main(prefix + args)


@pytest.fixture
def files(tmp_path: Path) -> tuple[Path, Path]:
    available = [[1 if (t // 7) % 3 else 0, 1 if (t // 5) % 4 else 0] for t in range(60)]
    spot = [[0.9 + 0.01 * (t % 4), 1.0] for t in range(60)]
    market = tmp_path / "market.csv"
    market.write_text(trace_text(available, spot=spot, on_demand=[[3.06, 3.2]] * 60, zones=ZONES, tick_s=300))
    job = tmp_path / "job.yaml"
    job.write_text(JOB.format(nodes=1, work="1.5h", deadline="2.5h"))
    return job, market


def replay_cost(lines: list[dict], market: Path, nodes: int, egress: float) -> float:
    """An independent reading of the rules, from the timeline and the trace file alone."""
    rows: dict[tuple[str, str], dict[str, float]] = {}
    regions: dict[str, str] = {}
    for row in market.read_text().splitlines()[1:]:
        time, _, region, zone, _, _, _, sp, od, av = row.split(",")
        rows[(time, zone)] = {"spot": float(sp), "od": float(od), "avail": float(av)}
        regions[zone] = region
    cost, previous, checkpoint = 0.0, "idle", None
    for line in lines:
        here = line["location"]
        prices = {z: rows[(line["time"], z)] for z in regions}
        if here == "on_demand":
            cost += min(p["od"] for p in prices.values()) * nodes * 300 / 3600
        elif here != "idle":
            assert prices[here]["avail"] >= nodes
            if here != previous and checkpoint is not None and regions[here] != checkpoint:
                cost += egress
            if here != previous:
                checkpoint = regions[here]
            cost += prices[here]["spot"] * nodes * 300 / 3600
        previous = here
    return cost


def test_json_and_timeline_agree_with_an_independent_replay(files: tuple[Path, Path], tmp_path: Path,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    job, market = files
    timeline = tmp_path / "timeline.jsonl"
    cli([str(job), "--market", str(market), "--policy", "broker,up_multi,optimal,greedy", "--starts", "3",
         "--seed", "5", "--json", "--timeline", str(timeline)])
    report = json.loads(capsys.readouterr().out)
    assert list(report) == ["broker", "up_multi", "optimal", "greedy"]
    fields = {"start", "cost", "cost_vs_on_demand", "spot_hours", "on_demand_hours", "preemptions", "migrations",
              "finish_hours", "deadline_met"}
    assert set(report["broker"]["runs"][0]) == fields
    assert set(report["greedy"]["runs"][0]) == fields | {"zone"}  # single-zone: once per zone
    assert len(report["greedy"]["runs"]) == 6 and len(report["broker"]["runs"]) == 3
    assert set(report["broker"]["mean"]) == (fields - {"start"}) | {"cost_vs_optimal"}
    assert report["optimal"]["mean"]["cost_vs_optimal"] == pytest.approx(1.0)
    lines = [json.loads(line) for line in timeline.read_text().splitlines()]
    for name in ("broker", "up_multi", "optimal"):
        for run in report[name]["runs"]:
            mine = [x for x in lines if x["policy"] == name and x["start"] == run["start"]]
            assert [x["tick"] for x in mine] == list(range(run["start"], run["start"] + len(mine)))
            assert len(mine) * 300 / 3600 == pytest.approx(run["finish_hours"])
            assert replay_cost(mine, market, 1, 50 * 0.02) == pytest.approx(run["cost"], abs=1e-5)
    costs = {name: report[name]["mean"]["cost"] for name in ("broker", "up_multi")}
    assert all(costs[n] >= report["optimal"]["mean"]["cost"] - 1e-9 for n in costs)


def test_table_is_the_default_output(files: tuple[Path, Path], capsys: pytest.CaptureFixture[str]) -> None:
    job, market = files
    cli([str(job), "--market", str(market), "--policy", "on_demand,broker"])
    out = capsys.readouterr().out
    assert "tiny: 1 x V100:1, work 1.5 h, deadline 2.5 h, 1 start(s)" in out
    on_demand_row = next(line for line in out.splitlines() if line.strip().startswith("on_demand"))
    assert "1.000" in on_demand_row and "100%" in on_demand_row


def test_start_time_selects_the_tick(files: tuple[Path, Path], capsys: pytest.CaptureFixture[str]) -> None:
    job, market = files
    cli([str(job), "--market", str(market), "--policy", "on_demand", "--start", "2024-01-01T01:00:00Z", "--json"])
    assert json.loads(capsys.readouterr().out)["on_demand"]["runs"][0]["start"] == 12


@pytest.mark.parametrize(("args", "job_text", "message"), [
    (["--policy", "cheapest,broker"], None, "--policy: unknown policy cheapest"),
    (["--starts", "0"], None, "--starts: expected a count from 1 to 100000, got 0"),
    (["--starts", "2", "--start", "2024-01-01T00:00:00Z"], None, "give one or the other"),
    (["--start", "2024-01-01T04:30:00Z"], None, "leaves no room for the deadline"),
    (["--restart-overhead", "soon"], None, "--restart-overhead: expected a duration"),
    (["--egress-per-gb", "-1"], None, "--egress-per-gb: expected a number from 0 to 1000, got -1.0"),
    ([], JOB.format(nodes=1, work="1h", deadline="2h").replace("V100:1", "A100:8"), "no rows for accelerators A100:8"),
    ([], JOB.format(nodes=1, work="1h", deadline="2h").replace("  work: 1h\n", ""), "broker.work: required"),
    ([], JOB.format(nodes=1, work="1h", deadline="9h"), "shorter than the job's deadline"),
])
def test_bad_input_exits_2_naming_the_field(files: tuple[Path, Path], tmp_path: Path, args: list[str],
                                            job_text: str | None, message: str,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    job, market = files
    if job_text is not None:
        job.write_text(job_text)
    timeline = tmp_path / "never.jsonl"
    with pytest.raises(SystemExit) as exit_info:
        cli([str(job), "--market", str(market), "--timeline", str(timeline), *args])
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err.replace("\n", " ")
    assert not timeline.exists()


@pytest.mark.traces
def test_real_trace_every_policy_meets_the_deadline(shared_traces: Path, tmp_path: Path,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    job = tmp_path / "job.yaml"
    job.write_text(JOB.format(nodes=4, work="24h", deadline="30h"))
    cli([str(job), "--market", str(shared_traces / "aws-v100-2023-4node-3zones.csv.gz"), "--starts", "2",
         "--json"])
    report = json.loads(capsys.readouterr().out)
    for name, entry in report.items():
        if name != "cheapest_spot":  # no deadline awareness at all
            assert entry["mean"]["deadline_met"] == 1.0, name
    assert report["broker"]["mean"]["cost"] < report["on_demand"]["mean"]["cost"]
    assert math.isclose(report["optimal"]["mean"]["cost_vs_optimal"], 1.0)


ANY_OF = """name: pick
num_nodes: 2
resources:
  any_of:
    - accelerators: A100-80GB:8
    - accelerators: H100:8
run: python train.py
broker:
  work: 10h
  deadline: 30h
{speed}"""


def _two_accelerator_market(path: Path) -> Path:
    """A100-80GB:8 at $10/node-h spot and H100:8 at $18, both always up, 40 hours of 5-minute ticks."""
    body = trace_text([[4]] * 480, spot=[[10.0]] * 480, on_demand=[[30.0]] * 480, zones=ZONES[:1], tick_s=300)
    a100 = [row.replace("p3.2xlarge,V100,1,", "p4de.24xlarge,A100-80GB,8,") for row in body.splitlines()[1:]]
    h100 = [row.replace("p3.2xlarge,V100,1,10.0,30.0", "p5.48xlarge,H100,8,18.0,60.0")
            for row in body.splitlines()[1:]]
    path.write_text("\n".join(body.splitlines()[:1] + a100 + h100) + "\n")
    return path


@pytest.mark.parametrize(("speed", "chosen", "per_work"), [
    # H100 2.1x: $18 / 2.1 = $8.571 per node-hour of work, below the A100-80GB's $10 / 1.0
    ("  speed: {H100: 2.1, A100-80GB: 1.0}\n", "H100:8", {"A100-80GB:8": 10.0, "H100:8": 18 / 2.1}),
    # H100 1.5x: $18 / 1.5 = $12 per node-hour of work: the A100-80GB's $10 is cheaper
    ("  speed: {H100: 1.5, A100-80GB: 1.0}\n", "A100-80GB:8", {"A100-80GB:8": 10.0, "H100:8": 12.0}),
    # no speeds: the default table (H100 4.8, A100-80GB 2.4): $18 / 2 = $9 per node-hour of work
    ("", "H100:8", {"A100-80GB:8": 10.0, "H100:8": 9.0}),
])
def test_any_of_runs_on_the_cheapest_unit_of_work(tmp_path: Path, capsys: pytest.CaptureFixture[str], speed: str,
                                                  chosen: str, per_work: dict[str, float]) -> None:
    market = _two_accelerator_market(tmp_path / "two.csv")
    job = tmp_path / "job.yaml"
    job.write_text(ANY_OF.format(speed=speed))
    cli([str(job), "--market", str(market), "--policy", "cheapest_spot,broker", "--json"])
    out = json.loads(capsys.readouterr().out)
    rows = {row["accelerator"]: row for row in out["gpu_choice"]}
    assert [a for a, row in rows.items() if row["chosen"]] == [chosen]
    for accelerator, value in per_work.items():
        assert rows[accelerator]["per_node_hour_of_work"] == pytest.approx(value, rel=1e-5)
    # the job then runs there: always-up spot, 10 h of work at the chosen type's speed, 2 nodes
    hourly = 10.0 if chosen.startswith("A100") else 18.0
    hours = 10.0 / rows[chosen]["speed"]
    ticks = math.ceil(hours * 12 - 1e-9) + math.ceil(0.2 * 12 - 1e-9)  # work, then the 0.2 h restart, in 5 min ticks
    for policy in ("cheapest_spot", "broker"):
        run = out[policy]["runs"][0]
        assert run["cost"] == pytest.approx(hourly * 2 * ticks / 12, rel=1e-6), policy
    capsys.readouterr()
    cli([str(job), "--market", str(market), "--policy", "cheapest_spot"])
    table = capsys.readouterr().out
    assert "cheapest unit of work" in table and chosen in table


TIED = """name: tied
resources:
  instance_type: {instance_type}
  accelerators: A100:8
run: python train.py
broker:
  work: 10h
  deadline: 30h
"""


def test_a_choice_tied_to_an_instance_type_is_simulated_on_that_type_only(tmp_path: Path,
                                                                          capsys: pytest.CaptureFixture[str]) -> None:
    # A100:8 sold as two types, always up: a2-highgpu-8g at $10 a node-hour, p4d.24xlarge at $18. A job
    # pinned to p4d.24xlarge is placed only there, so the simulation may not run it at $10.
    body = trace_text([[4]] * 480, spot=[[10.0]] * 480, on_demand=[[30.0]] * 480, zones=ZONES[:1], tick_s=300)
    cheap = [row.replace("p3.2xlarge,V100,1,", "a2-highgpu-8g,A100,8,") for row in body.splitlines()[1:]]
    dear = [row.replace("p3.2xlarge,V100,1,10.0,30.0", "p4d.24xlarge,A100,8,18.0,32.8")
            for row in body.splitlines()[1:]]
    market = tmp_path / "two-types.csv"
    market.write_text("\n".join(body.splitlines()[:1] + cheap + dear) + "\n")
    job = tmp_path / "job.yaml"
    ticks = 120 + 3  # 10 h of work and the 0.2 h restart, in 5-minute ticks
    for instance_type, hourly in (("p4d.24xlarge", 18.0), ("a2-highgpu-8g", 10.0)):
        job.write_text(TIED.format(instance_type=instance_type))
        cli([str(job), "--market", str(market), "--policy", "cheapest_spot", "--json"])
        run = json.loads(capsys.readouterr().out)["cheapest_spot"]["runs"][0]
        assert run["cost"] == pytest.approx(hourly * ticks / 12, rel=1e-6), instance_type
