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


SIGNALS = ",capacity_score,obtainability,estimated_uptime_s,placement_level"


def test_capacity_signal_columns_are_optional_and_an_empty_cell_is_unknown(tmp_path: Path) -> None:
    text = HEADER.rstrip("\n") + SIGNALS + "\n" + (
        "2024-01-01T00:00:00Z,gcp,us-central1,us-central1-a,a3-highgpu-8g,H100,8,20,88,1,,0.8,7200,\n"
        "2024-01-01T00:00:00Z,azure,eastus,eastus-1,Standard_ND96isr_H100_v5,H100,8,25,98,1,,,,High\n"
        "2024-01-01T00:05:00Z,azure,eastus,eastus-1,Standard_ND96isr_H100_v5,H100,8,25,98,1,,,,\n"
        "2024-01-01T00:10:00Z,gcp,us-central1,us-central1-a,a3-highgpu-8g,H100,8,21,88,1,,0.4,600,\n"
        "2024-01-01T00:10:00Z,azure,eastus,eastus-1,Standard_ND96isr_H100_v5,H100,8,25,98,1,,,,Low\n"
    )
    trace = parse_trace(io.StringIO(text))
    assert set(trace.signals) == {"capacity_score", "obtainability", "estimated_uptime_s", "placement_level"}
    gcp = [trace.quotes_at(t)[0] for t in range(3)]
    # the 00:05 gcp row is missing: it repeats 00:00; the azure row at 00:05 is there with an empty level
    assert [(q.obtainability, q.estimated_uptime_s) for q in gcp] == [(0.8, 7200.0), (0.8, 7200.0), (0.4, 600.0)]
    assert [trace.quotes_at(t)[1].placement_level for t in range(3)] == ["High", None, "Low"]
    assert {q.capacity_score for t in range(3) for q in trace.quotes_at(t)} == {None}
    path = tmp_path / "signals.csv"
    write_trace(path, [q for t in range(trace.num_ticks) for q in trace.quotes_at(t)], signals=True)
    again = read_trace(path)
    assert [q for t in range(3) for q in again.quotes_at(t)] == [q for t in range(3) for q in trace.quotes_at(t)]
    assert again.select(accelerator="H100").signals["obtainability"].shape == (3, 2)


def test_a_trace_in_the_current_format_has_no_signals_and_is_written_as_before(tmp_path: Path) -> None:
    text = HEADER + "2024-01-01T00:00:00Z,aws,r,z,i,V100,1,0.9,3.06,2\n"
    trace = parse_trace(io.StringIO(text))
    assert trace.signals == {} and trace.quotes_at(0)[0].obtainability is None
    path = tmp_path / "plain.csv"
    write_trace(path, trace.quotes_at(0))
    assert path.read_text() == text.replace("0.9,3.06", "0.9000,3.0600")  # the same header and columns


@pytest.mark.parametrize(("cells", "message"), [
    ("0,,,", "column capacity_score: expected a number from 1 to 10 or empty, got '0'"),
    ("11,,,", "column capacity_score: expected a number from 1 to 10"),
    (",nan,,", "column obtainability: expected a number from 0 to 1 or empty, got 'nan'"),
    (",1.5,,", "column obtainability: expected a number from 0 to 1"),
    (",inf,,", "column obtainability: expected a number from 0 to 1"),
    (",,-1,", "column estimated_uptime_s: expected a number from 0 to"),
    (",,1e30,", "column estimated_uptime_s: expected a number from 0 to"),
    (",,soon,", "column estimated_uptime_s: expected a number or empty, got 'soon'"),
    (",,,Excellent", "column placement_level: expected High, Medium, Low or empty, got 'Excellent'"),
    (",,,high", "column placement_level: expected High, Medium, Low or empty"),
    (",,,Hi\x00gh", "column placement_level: a NUL byte or over 200 characters"),
    (",,," + "H" * 300, "column placement_level: a NUL byte or over 200 characters"),
])
def test_bad_signal_cells_name_line_and_column(cells: str, message: str) -> None:
    row = "2024-01-01T00:00:00Z,aws,r,z,i,V100,1,0.9,3.06,2," + cells
    with pytest.raises(TraceError, match=message) as info:
        parse_trace(io.StringIO(HEADER.rstrip("\n") + SIGNALS + "\n" + row + "\n"), source="t.csv")
    assert "t.csv:2" in str(info.value)


@pytest.mark.parametrize(("cell", "message"), [
    ("1.5", "column preemption_rate: expected a number from 0 to 1 or empty, got '1.5'"),
    ("-0.1", "column preemption_rate: expected a number from 0 to 1"),
    ("nan", "column preemption_rate: expected a number from 0 to 1"),
    ("-inf", "column preemption_rate: expected a number from 0 to 1"),
    ("often", "column preemption_rate: expected a number or empty, got 'often'"),
    ("0.\x00", "column preemption_rate: a NUL byte or over 200 characters"),
    ("9" * 300, "column preemption_rate: a NUL byte or over 200 characters"),
])
def test_a_bad_preemption_rate_names_line_and_column(cell: str, message: str) -> None:
    row = "2024-01-01T00:00:00Z,gcp,r,z,i,H100,8,20,88,1," + cell.replace("\\x00", "\x00")
    with pytest.raises(TraceError, match=message) as info:
        parse_trace(io.StringIO(HEADER.rstrip("\n") + ",preemption_rate\n" + row + "\n"), source="t.csv")
    assert "t.csv:2" in str(info.value)


def test_a_preemption_rate_alone_is_read_and_written_back(tmp_path: Path) -> None:
    text = HEADER.rstrip("\n") + ",preemption_rate\n2024-01-01T00:00:00Z,gcp,r,z,i,H100,8,20,88,1,0.25\n"
    trace = parse_trace(io.StringIO(text))
    assert set(trace.signals) == {"preemption_rate"} and trace.quotes_at(0)[0].preemption_rate == 0.25
    path = tmp_path / "rate.csv"
    write_trace(path, trace.quotes_at(0), signals=True)
    assert read_trace(path).quotes_at(0) == trace.quotes_at(0)


def test_the_trace_shown_in_the_capacity_signals_page_reads() -> None:
    page = (Path(__file__).parents[2] / "docs" / "capacity-signals.md").read_text()
    block = page.split("```csv\n", 1)[1].split("```", 1)[0]
    trace = parse_trace(io.StringIO(block), source="docs/capacity-signals.md")
    quotes = {q.cloud: q for q in trace.quotes_at(0)}
    assert (quotes["gcp"].obtainability, quotes["gcp"].estimated_uptime_s) == (0.8, 7200.0)
    assert quotes["aws"].capacity_score == 9.0 and quotes["aws"].obtainability is None
