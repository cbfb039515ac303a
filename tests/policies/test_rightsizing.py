"""Right-sizing on cases worked by hand."""

from __future__ import annotations

import dataclasses

import pytest

from policies.rightsizing import GpuOffer, RightSizingRequest, speeds_from_step_times, suggest


def _req(**kw: object) -> RightSizingRequest:
    base: dict[str, object] = {"job_id": "j", "accelerator": "A100", "gpus": 1, "gpu_memory_gb": 40.0,
                               "peak_memory_gb": 6.0, "mean_utilization": 0.3, "gpu_hours": 10.0, "cost": 20.0}
    return RightSizingRequest(**{**base, **kw})  # type: ignore[arg-type]


def test_a_small_one_gpu_job_fits_a_quarter_of_its_gpu() -> None:
    # need = max(6 * 1.2 / 40 = 0.18, 0.3 / 0.8 = 0.375) -> 0.5 of the GPU; saves 20 * 0.5 = 10.
    (only,) = suggest(_req())
    assert (only.kind, only.saving) == ("fraction", pytest.approx(10.0))
    assert "ask for A100:0.5 and save $10.00" in only.text
    # 15 % busy and 6 GB: max(0.18, 0.1875) -> a quarter; saves 15.
    assert suggest(_req(mean_utilization=0.15))[0].saving == pytest.approx(15.0)
    assert suggest(_req(mean_utilization=0.9)) == ()  # busy: no advice
    assert suggest(_req(gpu_share=0.5)) == ()  # already a fraction


def test_a_multi_gpu_job_busy_a_quarter_of_the_time_needs_fewer() -> None:
    # 8 GPUs at 25 %: ceil(8 * 0.25 / 0.8) = ceil(2.5) = 3; saves 100 * (1 - 3/8) = 62.5.
    (only,) = suggest(_req(gpus=8, mean_utilization=0.25, gpu_hours=80.0, cost=100.0))
    assert (only.kind, only.saving) == ("fewer_gpus", pytest.approx(62.5))
    assert only.text.startswith("its 8 GPUs were 25% busy: 3 would have been 67% busy")


def test_the_cheapest_gpu_with_room_for_the_peak_counts_the_slower_busy_time() -> None:
    speeds = {"A100": 2.2, "A10G": 0.55, "T4": 0.35}
    offers = (GpuOffer("T4", 16.0, 0.20), GpuOffer("A10G", 24.0, 0.50), GpuOffer("L4", 4.0, 0.01))
    # 2 GPUs, peak 12 GB (needs 14.4 GB: T4 and A10G fit, L4 does not), 10 % busy, 10 GPU-h for $40.
    # T4: 0.1 * 2.2/0.35 + 0.9 = 1.5286x; 10 * 1.5286 * 0.20 = 3.057. A10G: 0.1 * 4 + 0.9 = 1.3x; 6.5.
    found = suggest(_req(gpus=2, peak_memory_gb=12.0, mean_utilization=0.1, gpu_hours=10.0, cost=40.0,
                         offers=offers, speeds=speeds))
    assert [s.kind for s in found] == ["cheaper_gpu", "fewer_gpus"]
    cheaper = found[0]
    assert cheaper.saving == pytest.approx(40 - 10 * (0.1 * 2.2 / 0.35 + 0.9) * 0.20)
    assert cheaper.slower == pytest.approx(1.5285714)
    assert "2x T4 (16 GB" in cheaper.text and "about 1.53x as long" in cheaper.text and "not measured" in cheaper.text
    assert found[1].saving == pytest.approx(20.0)  # ceil(2 * 0.1 / 0.8) = 1 of 2


def test_nothing_fits_or_nothing_is_known() -> None:
    assert suggest(_req(peak_memory_gb=39.0, mean_utilization=0.2, offers=(GpuOffer("T4", 16.0, 0.1),))) == ()
    assert suggest(_req(cost=0.0)) == ()
    assert suggest(_req(mean_utilization=float("nan"))) == ()


def test_speeds_from_step_times_are_one_over_the_median_and_need_two_types() -> None:
    # A100: median of 2, 2.5, 3 = 2.5 s a step -> 0.4; T4: median of 4, 6 = 5 -> 0.2. One type alone: nothing.
    assert speeds_from_step_times({"A100": [3.0, 2.0, 2.5], "T4": [4.0, 6.0]}) == pytest.approx({"A100": 0.4,
                                                                                                  "T4": 0.2})
    assert speeds_from_step_times({"A100": [2.0], "T4": []}) == {}
    assert speeds_from_step_times({"A100": [2.0], "T4": [float("nan")]}) == {}


def test_measured_speeds_replace_the_table_only_where_both_types_were_measured() -> None:
    # 1 GPU, peak 12 GB, 15 % busy, 1 GPU-h for $3; a T4 at $0.60. Measured: the T4 2.5x slower ->
    # 0.15 * 2.5 + 0.85 = 1.225x as long, $0.735. An L4 (24 GB, $0.50) not measured: the table's
    # 2.2 / 0.6 -> 0.15 * 3.667 + 0.85 = 1.4x, $0.70: cheaper, and said to be from the table.
    offers = (GpuOffer("T4", 16.0, 0.60),)
    request = _req(peak_memory_gb=12.0, mean_utilization=0.15, gpu_hours=1.0, cost=3.0, offers=offers,
                   speeds={"A100": 2.2, "T4": 0.35, "L4": 0.6}, measured_speeds={"A100": 0.5, "T4": 0.2}, runs=3)
    found = {s.kind: s for s in suggest(request)}
    assert found["cheaper_gpu"].saving == pytest.approx(3.0 - 1.225 * 0.60)
    assert found["cheaper_gpu"].text.endswith("(speeds measured from its step times on both)")
    assert "15% busy over its last 3 runs" in found["fraction"].text
    with_l4 = suggest(dataclasses.replace(request, offers=(*offers, GpuOffer("L4", 24.0, 0.50))))
    cheapest = next(s for s in with_l4 if s.kind == "cheaper_gpu")
    assert cheapest.slower == pytest.approx(0.15 * 2.2 / 0.6 + 0.85)
    assert cheapest.text.startswith("1x L4") and cheapest.text.endswith("(speeds from the default speed table, "
                                                                        "not measured)")
