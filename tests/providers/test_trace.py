from __future__ import annotations

import io
from pathlib import Path

import pytest

from providers.trace import TraceError, parse_trace, read_trace, write_trace

HEADER = "time,cloud,region,zone,instance_type,accelerator,gpus_per_node,spot_price,on_demand_price,available_nodes\n"


def test_missing_tick_is_filled_with_previous_values() -> None:
    text = HEADER + (
        "2024-01-01T00:00:00Z,aws,us-east-1,us-east-1a,p3.2xlarge,V100,1,0.9,3.06,2\n"
        "2024-01-01T00:00:00Z,gcp,us-central1,us-central1-a,n1-v100,V100,1,0.8,2.48,1\n"
        "2024-01-01T00:05:00Z,aws,us-east-1,us-east-1a,p3.2xlarge,V100,1,1.0,3.06,0\n"
        "2024-01-01T00:05:00Z,gcp,us-central1,us-central1-a,n1-v100,V100,1,0.7,2.48,3\n"
        "2024-01-01T00:15:00Z,aws,us-east-1,us-east-1a,p3.2xlarge,V100,1,1.1,3.06,1\n"
        "2024-01-01T00:15:00Z,gcp,us-central1,us-central1-a,n1-v100,V100,1,0.6,2.48,0\n"
    )
    trace = parse_trace(io.StringIO(text))
    assert trace.num_ticks == 4 and trace.tick_seconds == 300
    assert trace.spot_price[2].tolist() == [1.0, 0.7]  # the missing 00:10 tick
    assert trace.available_nodes[:, 0].tolist() == [2, 0, 0, 1]
    assert trace.select(accelerator="v100", gpus_per_node=8).zones == ()


@pytest.mark.parametrize(
    ("row", "message"),
    [
        ("2024-01-01T00:00:00Z,aws,r,z,i,V100,1,cheap,3.06,2", "column spot_price: expected a number"),
        ("yesterday,aws,r,z,i,V100,1,0.9,3.06,2", "column time: expected an ISO 8601"),
        ("2024-01-01T00:00:00Z,aws,r,z", "4 columns, expected 10"),
    ],
)
def test_bad_rows_name_line_and_column(row: str, message: str) -> None:
    with pytest.raises(TraceError, match=message) as info:
        parse_trace(io.StringIO(HEADER + row + "\n"), source="t.csv")
    assert "t.csv:2" in str(info.value)


def test_round_trip_through_gzip(tmp_path: Path) -> None:
    trace = parse_trace(io.StringIO(HEADER + "2024-01-01T00:00:00Z,aws,r,z,i,V100,1,0.9,3.06,2\n"
                                    "2024-01-01T00:01:00Z,aws,r,z,i,V100,1,0.8,3.06,1\n"))
    path = tmp_path / "t.csv.gz"
    rows = write_trace(path, [q for t in range(trace.num_ticks) for q in trace.quotes_at(t)])
    again = read_trace(path)
    assert rows == 2 and again.spot_price.tolist() == trace.spot_price.tolist()
    assert again.start == trace.start


def test_real_trace_loads(shared_traces: Path) -> None:
    trace = read_trace(shared_traces / "aws-v100-2022-1node-2zones.csv.gz")
    assert trace.tick_seconds == 300 and len(trace.zones) == 4
    assert trace.select("V100", 8).zones[0].instance_type == "p3.16xlarge"
