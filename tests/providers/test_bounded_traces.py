"""Every trace and list the CLI reads is read in bounded memory and time, and a row that cannot be
meant (a price of 1e308 or 0, a second row for one tick and zone) is refused naming its line."""

from __future__ import annotations

import gzip
import io
import os
import subprocess
import sys
from pathlib import Path

import pytest

from broker.sim.sharing import ClusterTraceError, read_nodes
from broker.sim.workload import WorkloadError, read_workload
from providers.bounded import MAX_LINE_CHARS
from providers.trace import MAX_CELLS, TraceError, parse_trace, read_trace

ROOT = Path(__file__).resolve().parents[2]
HEADER = "time,cloud,region,zone,instance_type,accelerator,gpus_per_node,spot_price,on_demand_price,available_nodes\n"
ROW = "2024-01-01T00:{minute:02d}:00Z,aws,r,z,i,V100,1,{spot},3.06,2\n"


def test_dev_zero_as_a_market_trace_is_refused_at_its_first_line() -> None:
    with pytest.raises(TraceError, match=rf"/dev/zero:1: a line of more than {MAX_LINE_CHARS} characters"):
        read_trace("/dev/zero")


def test_a_line_with_no_end_is_refused_naming_it(tmp_path: Path) -> None:
    path = tmp_path / "long.csv"
    path.write_text(HEADER + ROW.format(minute=0, spot=0.9) + "x" * (MAX_LINE_CHARS + 10))
    with pytest.raises(TraceError, match=r"long.csv:3: a line of more than"):
        read_trace(path)


def test_a_small_gzip_of_repeated_rows_is_refused_at_the_first_repeat(tmp_path: Path) -> None:
    path = tmp_path / "bomb.csv.gz"
    with gzip.open(path, "wt") as handle:  # 100,000 copies of one row: small on disk
        handle.write(HEADER + ROW.format(minute=0, spot=0.9) * 100_000)
    with pytest.raises(TraceError, match=r"bomb.csv.gz:3: a second row for z i at 2024-01-01T00:00:00Z "
                                         r"\(the first is line 2\)"):
        read_trace(path)


@pytest.mark.parametrize("spot", ["1e308", "0", "0.0", "100001"])
def test_a_price_that_cannot_be_meant_is_refused_naming_the_column(spot: str) -> None:
    with pytest.raises(TraceError, match=r"t.csv:2: column spot_price: expected a price above 0"):
        parse_trace(io.StringIO(HEADER + ROW.format(minute=0, spot=spot)), source="t.csv")


def test_a_tick_span_too_long_for_its_rows_is_refused_before_anything_is_allocated() -> None:
    text = HEADER + ROW.format(minute=0, spot=0.9) + "2024-01-01T00:00:01Z,aws,r,z,i,V100,1,0.9,3.06,2\n" + \
        "2025-08-01T00:00:00Z,aws,r,z,i,V100,1,0.9,3.06,2\n"  # 19 months at 1 s
    with pytest.raises(TraceError, match=rf"column time: .* ticks; at most {MAX_CELLS}"):
        parse_trace(io.StringIO(text), source="t.csv")


def test_dev_zero_as_a_workload_or_a_pod_list_is_refused() -> None:
    with pytest.raises(WorkloadError, match=r"/dev/zero:1: a line of more than"):
        read_workload(Path("/dev/zero"))
    with pytest.raises(ClusterTraceError, match=r"/dev/zero: more than"):
        read_nodes(Path("/dev/zero"))


@pytest.mark.parametrize(("row", "field"), [
    ("a,1,nan,10,resnet", "submit_time"), ("a,1,0,inf,resnet", "duration"), ("a,1,0,-inf,resnet", "duration"),
    ("a,1,0,1e400,resnet", "duration"), ("a,99999999999999999999,0,10,resnet", "num_gpus"),
    ("a\x00b,1,0,10,resnet", "job_id"), ("a,1,0,10," + "m" * 500, "model"),
])
def test_a_workload_row_that_cannot_be_meant_is_refused_naming_the_field(tmp_path: Path, row: str,
                                                                         field: str) -> None:
    path = tmp_path / "w.csv"
    path.write_text("job_id,num_gpus,submit_time,duration,model\n" + row + "\n")
    with pytest.raises(WorkloadError, match=rf"w.csv: row 2: {field}"):
        read_workload(path)


@pytest.mark.slow
@pytest.mark.parametrize(("args", "variables"), [
    (["simulate", "examples/quickstart.yaml", "--market", "/dev/zero"], {}),
    (["launch", "examples/quickstart.yaml"], {"BROKER_MARKET": "/dev/zero"}),
])
def test_the_cli_refuses_dev_zero_as_a_market_in_one_line(args: list[str], variables: dict[str, str],
                                                          broker_home: Path) -> None:
    done = subprocess.run([sys.executable, "-m", "broker", *args], cwd=ROOT, capture_output=True, text=True,
                          env={**os.environ, "BROKER_HOME": str(broker_home), **variables}, timeout=120)
    assert done.returncode == 2, done.stderr
    assert "/dev/zero:1: a line of more than" in done.stderr and "Traceback" not in done.stderr
