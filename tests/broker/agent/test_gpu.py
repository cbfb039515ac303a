"""GPU sampling on the node, driven by a stand-in ``pynvml`` speaking nvidia-ml-py's API (there is no GPU here)."""

from __future__ import annotations

import importlib.util
import inspect
import json
import os
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from broker.agent.gpu import GpuReading, NvmlReader, SamplingUnavailable, job_pids, open_reader, visible_devices
from broker.agent.gpu_sampling import IDLE_BELOW, GpuSampler, MinuteAggregator, idle_below_from
from tests.fakenvml import pynvml as fake

FAKE_DIR = Path(fake.__file__).parent


def _real_pynvml() -> ModuleType:
    """NVIDIA's own bindings (installed with the dev tools), loaded without a GPU: to hold the stand-in to them."""
    for entry in sys.path:
        path = Path(entry) / "pynvml.py"
        if path.is_file() and path.parent != FAKE_DIR:
            spec = importlib.util.spec_from_file_location("real_pynvml", path)
            assert spec is not None and spec.loader is not None
            module = importlib.util.module_from_spec(spec)
            sys.modules["real_pynvml"] = module  # the bindings look themselves up there
            try:
                spec.loader.exec_module(module)
            finally:
                del sys.modules["real_pynvml"]
            return module
    pytest.skip("nvidia-ml-py is not installed")


def test_the_stand_in_speaks_the_real_bindings_api() -> None:
    real = _real_pynvml()
    for name in ("nvmlInit", "nvmlShutdown", "nvmlDeviceGetCount", "nvmlDeviceGetHandleByIndex",
                 "nvmlDeviceGetHandleByUUID", "nvmlDeviceGetIndex", "nvmlDeviceGetUUID", "nvmlDeviceGetName",
                 "nvmlDeviceGetUtilizationRates", "nvmlDeviceGetMemoryInfo", "nvmlDeviceGetPowerUsage",
                 "nvmlDeviceGetComputeRunningProcesses", "nvmlDeviceGetProcessUtilization"):
        ours = list(inspect.signature(getattr(fake, name)).parameters)
        theirs = list(inspect.signature(getattr(real, name)).parameters)
        assert ours == theirs, name
    for code in ("NVML_ERROR_UNINITIALIZED", "NVML_ERROR_NOT_SUPPORTED", "NVML_ERROR_NOT_FOUND",
                 "NVML_ERROR_LIBRARY_NOT_FOUND", "NVML_ERROR_GPU_IS_LOST", "NVML_ERROR_INVALID_ARGUMENT"):
        assert getattr(fake, code) == getattr(real, code), code
    for struct in ("c_nvmlUtilization_t", "c_nvmlMemory_t", "c_nvmlProcessUtilizationSample_t"):
        assert getattr(fake, struct)._fields_ == getattr(real, struct)._fields_ or \
            [n for n, _ in getattr(fake, struct)._fields_] == [n for n, _ in getattr(real, struct)._fields_]
    # NVMLError(code) is the code's subclass, as in the real bindings.
    assert type(real.NVMLError(real.NVML_ERROR_NOT_SUPPORTED)).__name__ == "NVMLError_NotSupported"
    assert isinstance(fake.NVMLError(fake.NVML_ERROR_NOT_SUPPORTED), fake.NVMLError_NotSupported)
    assert str(fake.NVMLError(3)) == "Not Supported"


@pytest.fixture
def nvml(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """The stand-in as ``pynvml``, replaying what ``write`` gives it."""
    monkeypatch.setitem(sys.modules, "pynvml", fake)

    def write(data: dict[str, Any]) -> None:
        path = tmp_path / "readings.json"
        path.write_text(json.dumps(data))
        monkeypatch.setenv("FAKE_NVML_READINGS", str(path))

    yield write
    fake.nvmlShutdown()


TWO_GPUS = {"devices": [
    {"uuid": "GPU-aaaa", "memory_total_mb": 81920, "readings": [
        {"gpu": 90, "memory": 40, "used_mb": 30000, "power_w": 300.0},
        {"gpu": 10, "memory": 5, "used_mb": 31000, "power_w": 100.0}]},
    {"uuid": "GPU-bbbb", "memory_total_mb": 81920, "unsupported": ["power"],
     "readings": [{"gpu": 3, "memory": 1, "used_mb": 1024}]},
]}


def test_nvml_readings_in_the_broker_s_units(nvml: Any) -> None:
    nvml(TWO_GPUS)
    reader = NvmlReader(["1", "GPU-aaaa"])
    first = reader.read(frozenset())
    assert first == [
        GpuReading(gpu=1, uuid="GPU-bbbb", utilization=3.0, memory_utilization=1.0, memory_used_mb=1024.0,
                   memory_total_mb=81920.0, power_w=None),
        GpuReading(gpu=0, uuid="GPU-aaaa", utilization=90.0, memory_utilization=40.0, memory_used_mb=30000.0,
                   memory_total_mb=81920.0, power_w=300.0)]
    second = reader.read(frozenset())
    assert (second[1].utilization, second[1].power_w, second[1].memory_used_mb) == (10.0, 100.0, 31000.0)
    assert (1, "power") in reader._skip.unsupported  # "not supported" is not asked again
    reader.close()


def test_every_gpu_of_the_node_when_cuda_visible_devices_is_unset(nvml: Any) -> None:
    nvml(TWO_GPUS)
    assert [r.gpu for r in open_reader({}).read(frozenset())] == [0, 1]
    assert visible_devices({"CUDA_VISIBLE_DEVICES": "0,-1,1"}) == ["0"]
    with pytest.raises(SamplingUnavailable, match="sees no GPU"):
        open_reader({"CUDA_VISIBLE_DEVICES": ""})


@pytest.mark.parametrize(("data", "devices", "says"), [
    ({"init_error": 12}, ["0"], "NVML Shared Library Not Found"),
    ({"init_error": 9}, ["0"], "Driver Not Loaded"),
    (TWO_GPUS, ["7"], "Invalid Argument"),
    (TWO_GPUS, ["GPU-nope"], "Not Found"),
    (TWO_GPUS, ["MIG-1234"], "only whole GPUs"),
])
def test_a_node_where_nvml_fails_gives_one_clear_reason(nvml: Any, data: dict[str, Any], devices: list[str],
                                                        says: str) -> None:
    nvml(data)
    with pytest.raises(SamplingUnavailable, match=says):
        NvmlReader(devices)


def test_a_gpu_lost_mid_job_stops_the_sampling(nvml: Any) -> None:
    nvml({"devices": [{"uuid": "GPU-a", "lost": True}]})
    reader = NvmlReader(["0"])
    with pytest.raises(SamplingUnavailable, match="GPU is lost"):
        reader.read(frozenset())


def test_without_pynvml_the_agent_says_so(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", None)  # import pynvml raises ImportError
    with pytest.raises(SamplingUnavailable, match="pynvml is not installed"):
        open_reader({"CUDA_VISIBLE_DEVICES": "0"})


def test_a_shared_gpu_reads_the_job_s_own_processes(nvml: Any) -> None:
    me, other = os.getpid(), 1
    nvml({"devices": [{"uuid": "GPU-s", "memory_total_mb": 40960, "readings": [{"gpu": 80, "used_mb": 20000}],
                       "processes": [{"pid": me, "sm": 25, "used_mb": 5000},
                                     {"pid": other, "sm": 55, "used_mb": 15000}]}]})
    reader = NvmlReader(["0"])
    reading = reader.read(frozenset({me}))[0]
    assert (reading.utilization, reading.job_utilization, reading.job_memory_mb) == (80.0, 25.0, 5000.0)
    # No sample since the last read: NVML says "not found", which is no use of the GPU, not a failure.
    assert reader._job_share(0, reader.handles[0][2], frozenset({me}))[0] == 0.0


def test_a_shared_gpu_without_per_process_figures_keeps_the_whole_gpu_s(nvml: Any) -> None:
    nvml({"devices": [{"uuid": "GPU-s", "unsupported": ["process_utilization", "processes"],
                       "readings": [{"gpu": 70}]}]})
    reading = NvmlReader(["0"]).read(frozenset({os.getpid()}))[0]
    assert (reading.utilization, reading.job_utilization, reading.job_memory_mb) == (70.0, None, None)


def test_the_job_s_session_is_found_in_proc() -> None:
    assert os.getpid() in job_pids(os.getsid(0))
    assert job_pids(2**31 - 1) == frozenset()


def test_minutes_hold_the_mean_and_the_peak_of_their_samples() -> None:
    agg = MinuteAggregator()
    t0 = 1_700_000_020.0  # 40 s into a minute
    agg.add(t0, [GpuReading(0, "GPU-a", 10.0, 2.0, 1000.0, 8000.0, 100.0)])
    agg.add(t0 + 10, [GpuReading(0, "GPU-a", 30.0, 4.0, 3000.0, 8000.0, None)])
    agg.add(t0 + 20, [GpuReading(0, "GPU-a", 50.0, float("nan"), 2000.0, 8000.0, 300.0)])  # the next minute
    assert agg.complete(t0 + 20) == [{
        "gpu": 0, "uuid": "GPU-a", "minute": "2023-11-14T22:13:00+00:00", "samples": 2, "idle_samples": 0,
        "memory_total_mb": 8000.0,
        "utilization_mean": 20.0, "utilization_max": 30.0, "memory_utilization_mean": 3.0,
        "memory_utilization_max": 4.0, "memory_used_mb_mean": 2000.0, "memory_used_mb_max": 3000.0,
        "power_w_mean": 100.0, "power_w_max": 100.0, "job_utilization_mean": None, "job_utilization_max": None,
        "job_memory_mb_mean": None, "job_memory_mb_max": None}]
    last = agg.complete(None)
    assert [(m["samples"], m["utilization_mean"], m["memory_utilization_mean"]) for m in last] == [(1, 50.0, None)]
    assert agg.complete(None) == []


def test_a_minute_counts_its_samples_below_the_idle_threshold_by_the_job_s_own_figure_where_given() -> None:
    agg = MinuteAggregator(idle_below=0.25)
    t0 = 1_700_000_040.0  # the start of a minute
    readings = [
        GpuReading(0, "GPU-a", utilization=95.0), GpuReading(0, "GPU-a", utilization=24.9),
        GpuReading(0, "GPU-a", utilization=0.0), GpuReading(0, "GPU-a", utilization=25.0),
        # A shared GPU: the whole GPU is busy with others, the job's own processes idle: idle for the job.
        GpuReading(1, "GPU-b", utilization=90.0, job_utilization=2.0),
        GpuReading(1, "GPU-b", utilization=90.0, job_utilization=60.0),
        # A GPU that gives no utilisation (or garbage): its samples are not counted either way.
        GpuReading(2, "GPU-c", utilization=float("nan")), GpuReading(2, "GPU-c", utilization=None),
    ]
    for i, reading in enumerate(readings):
        agg.add(t0 + i, [reading])
    assert [(m["gpu"], m["samples"], m["idle_samples"]) for m in agg.complete(None)] == [
        (0, 4, 2), (1, 2, 1), (2, 2, None)]


@pytest.mark.parametrize("text", ["abc", "nan", "inf", "-0.1", "1.5", "1e309", "0.1\x00", "\ud800", "9" * 5000])
def test_an_idle_threshold_that_is_not_a_share_is_refused_for_the_default_and_said_once(text: str) -> None:
    events = _Events()
    assert idle_below_from({"BROKER_GPU_IDLE_BELOW": text}, events) == IDLE_BELOW
    assert len(events.written) == 1
    event, data = events.written[0]
    assert event == "gpu_idle_below_refused" and data["variable"] == "BROKER_GPU_IDLE_BELOW"
    assert len(data["value"]) <= 40


def test_the_broker_s_idle_threshold_reaches_the_agent() -> None:
    events = _Events()
    assert idle_below_from({"BROKER_GPU_IDLE_BELOW": "0.05"}, events) == 0.05
    assert idle_below_from({"BROKER_GPU_IDLE_BELOW": "1"}, events) == 1.0
    assert idle_below_from({}, events) == IDLE_BELOW
    assert events.written == []


class _Events:
    def __init__(self) -> None:
        self.written: list[tuple[str, dict[str, Any]]] = []

    def write(self, event: str, **data: Any) -> None:
        self.written.append((event, data))


def test_the_sampler_sends_every_minute_at_stop_and_a_failing_reader_once(nvml: Any) -> None:
    nvml(TWO_GPUS)
    sent: list[list[dict[str, Any]]] = []
    got = threading.Event()

    def send(minutes: list[dict[str, Any]]) -> None:
        sent.append(minutes)
        got.set()

    events = _Events()
    sampler = GpuSampler(lambda: open_reader({"CUDA_VISIBLE_DEVICES": "0"}), frozenset, send, events,
                         sample_s=0.01, report_s=3600.0)
    before = fake._state["calls"]
    sampler.start()
    assert _wait_for(lambda: fake._state["calls"] >= before + 3)
    sampler.stop()
    assert got.wait(5.0)
    assert sum(m["samples"] for batch in sent for m in batch) >= 3
    assert all(m["utilization_max"] == 90.0 for batch in sent for m in batch)
    assert events.written == []  # nothing went wrong

    def broken() -> Any:
        raise SamplingUnavailable("NVML: Driver Not Loaded")

    failing = GpuSampler(broken, frozenset, send, events, sample_s=0.01)
    failing.start()
    failing.stop()
    assert events.written == [("gpu_sampling_unavailable", {"reason": "NVML: Driver Not Loaded"})]


def _wait_for(condition: Any, timeout: float = 10.0) -> bool:
    done = threading.Event()
    for _ in range(int(timeout / 0.01)):
        if condition():
            return True
        done.wait(0.01)
    return bool(condition())


class _Garbage:
    def read(self, pids: frozenset[int]) -> list[object]:
        return ["not a reading", GpuReading(0, "x", utilization=float("inf"), memory_used_mb=-5.0, power_w=True)]


def garbage_sampler(devices: list[str] | None) -> _Garbage:
    return _Garbage()


def failing_factory(devices: list[str] | None) -> object:
    raise OSError("device busy")


def test_a_sampler_setting_replaces_nvml_and_what_it_returns_is_checked() -> None:
    env = {"BROKER_GPU_SAMPLER": f"{__name__}:garbage_sampler"}
    reader = open_reader(env)
    agg = MinuteAggregator()
    agg.add(60.0, [r for r in reader.read(frozenset()) if isinstance(r, GpuReading)])
    minute = agg.complete(None)[0]
    assert (minute["utilization_mean"], minute["memory_used_mb_mean"], minute["power_w_mean"]) == (None, None, None)
    with pytest.raises(SamplingUnavailable, match="OSError: device busy"):
        open_reader({"BROKER_GPU_SAMPLER": f"{__name__}:failing_factory"})
    for bad in ("os.system", "no_such_module:f", f"{__name__}:nothing_here", "a:b; rm -rf /"):
        with pytest.raises(SamplingUnavailable, match="BROKER_GPU_SAMPLER"):
            open_reader({"BROKER_GPU_SAMPLER": bad})


def test_a_notice_sends_the_minute_so_far_at_once(nvml: Any) -> None:
    nvml(TWO_GPUS)
    sent: list[list[dict[str, Any]]] = []
    got = threading.Event()

    def send(minutes: list[dict[str, Any]]) -> None:
        sent.append(minutes)
        got.set()

    sampler = GpuSampler(lambda: open_reader({"CUDA_VISIBLE_DEVICES": "0,1"}), frozenset, send, _Events(),
                         sample_s=3600.0, report_s=3600.0)
    before = fake._state["calls"]
    sampler.start()
    assert _wait_for(lambda: fake._state["calls"] >= before + 2)  # one sample of each GPU, then a long wait
    sampler.send_now()
    assert got.wait(5.0)
    assert sorted((m["gpu"], m["samples"]) for m in sent[0]) == [(0, 1), (1, 1)]
    sampler.stop()
