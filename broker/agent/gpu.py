"""What the job's GPUs do: read through NVML every few seconds, kept as per-minute means and peaks.

The agent reads every GPU its job holds (``CUDA_VISIBLE_DEVICES``: node indices or UUIDs; every
GPU of the node when unset) with NVIDIA's own bindings (``nvidia-ml-py``, imported as ``pynvml``,
here and only when a job starts): GPU and memory utilisation, memory used and total, power draw.
On a GPU the job shares with others (``BROKER_GPU_SHARE``), it also reads the job's own share from
NVML's per-process figures (its processes' SM utilisation and memory), where the driver gives them.

A query the GPU does not answer (NVML's "not supported") is left out of the readings from then
on; any other NVML failure, or a node without NVML, stops the sampling for good: the caller says
so once in its log, and the job runs on unaffected.

``BROKER_GPU_SAMPLER=module:callable`` replaces the NVML reader: the callable takes the list of
devices (as ``CUDA_VISIBLE_DEVICES`` names them) and returns an object with ``read(pids)``
returning ``GpuReading``s (and optionally ``close()``).
"""

from __future__ import annotations

import contextlib
import importlib
import math
import os
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any, Protocol

from broker.errors import BrokerError

SAMPLER_VARIABLE = "BROKER_GPU_SAMPLER"
MAX_GPUS = 64
_SAMPLER = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$")


class SamplingUnavailable(BrokerError, RuntimeError):
    """NVML is missing or failed: the agent reports no GPU figures for this job."""


@dataclass(frozen=True, slots=True)
class GpuReading:
    """One GPU at one moment. ``None``: the GPU does not give that figure."""

    gpu: int  # the node's index of the GPU (what the broker's allocation names)
    uuid: str = ""
    utilization: float | None = None  # percent, 0-100
    memory_utilization: float | None = None  # percent of time the memory was read or written
    memory_used_mb: float | None = None
    memory_total_mb: float | None = None
    power_w: float | None = None
    job_utilization: float | None = None  # on a shared GPU: the job's processes' SM utilisation
    job_memory_mb: float | None = None  # on a shared GPU: the job's processes' memory


class GpuReader(Protocol):
    def read(self, pids: frozenset[int]) -> Sequence[GpuReading]: ...


def visible_devices(env: dict[str, str]) -> list[str] | None:
    """The devices the job may use, as ``CUDA_VISIBLE_DEVICES`` names them; None: every GPU of the node."""
    text = env.get("CUDA_VISIBLE_DEVICES")
    if text is None:
        return None
    names = [n.strip() for n in text.split(",") if n.strip()]
    out: list[str] = []
    for name in names[:MAX_GPUS]:
        if name.startswith("-") or name == "NoDevFiles":
            break  # CUDA stops at the first invalid entry
        out.append(name)
    return out


class _Skip:
    """Queries a GPU answered "not supported" to: never asked again."""

    def __init__(self) -> None:
        self.unsupported: set[tuple[int, str]] = set()


@dataclass
class NvmlReader:
    """The GPUs read through ``pynvml``."""

    devices: list[str] | None
    nvml: Any = None
    handles: list[tuple[int, str, Any]] = field(default_factory=list)
    _skip: _Skip = field(default_factory=_Skip)
    _last_seen: dict[int, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        try:
            import pynvml
        except ImportError as exc:
            raise SamplingUnavailable(f"pynvml is not installed ({exc})") from None
        self.nvml = pynvml
        try:
            pynvml.nvmlInit()
            names = self.devices if self.devices is not None else [
                str(i) for i in range(min(int(pynvml.nvmlDeviceGetCount()), MAX_GPUS))]
            for name in names:
                if name.isdigit():
                    handle = pynvml.nvmlDeviceGetHandleByIndex(int(name))
                    index = int(name)
                elif name.startswith("GPU-"):
                    handle = pynvml.nvmlDeviceGetHandleByUUID(name)
                    index = int(pynvml.nvmlDeviceGetIndex(handle))
                else:  # MIG instances are read by other calls
                    raise SamplingUnavailable(f"device {name[:60]!r}: only whole GPUs are sampled")
                uuid = pynvml.nvmlDeviceGetUUID(handle)
                self.handles.append((index, uuid.decode() if isinstance(uuid, bytes) else str(uuid), handle))
        except pynvml.NVMLError as exc:
            raise SamplingUnavailable(f"NVML: {exc}") from None

    def _ask(self, index: int, what: str, call: Callable[[], Any]) -> Any:
        if (index, what) in self._skip.unsupported:
            return None
        try:
            return call()
        except self.nvml.NVMLError as exc:
            if getattr(exc, "value", None) == self.nvml.NVML_ERROR_NOT_SUPPORTED:
                self._skip.unsupported.add((index, what))
                return None
            if what == "process_utilization" and getattr(exc, "value", None) == self.nvml.NVML_ERROR_NOT_FOUND:
                return []  # no process used the GPU since the last read
            raise SamplingUnavailable(f"NVML {what} on GPU {index}: {exc}") from None

    def read(self, pids: frozenset[int]) -> list[GpuReading]:
        nvml = self.nvml
        out = []
        for index, uuid, handle in self.handles:
            rates = self._ask(index, "utilization", partial(nvml.nvmlDeviceGetUtilizationRates, handle))
            memory = self._ask(index, "memory", partial(nvml.nvmlDeviceGetMemoryInfo, handle))
            power = self._ask(index, "power", partial(nvml.nvmlDeviceGetPowerUsage, handle))
            job_util = job_memory = None
            if pids:
                job_util, job_memory = self._job_share(index, handle, pids)
            out.append(GpuReading(
                gpu=index, uuid=uuid,
                utilization=float(rates.gpu) if rates is not None else None,
                memory_utilization=float(rates.memory) if rates is not None else None,
                memory_used_mb=memory.used / 2**20 if memory is not None else None,
                memory_total_mb=memory.total / 2**20 if memory is not None else None,
                power_w=power / 1000.0 if power is not None else None,
                job_utilization=job_util, job_memory_mb=job_memory))
        return out

    def _job_share(self, index: int, handle: Any, pids: frozenset[int]) -> tuple[float | None, float | None]:
        nvml = self.nvml
        since = self._last_seen.get(index, 0)
        samples = self._ask(index, "process_utilization", partial(nvml.nvmlDeviceGetProcessUtilization, handle, since))
        util = None
        if samples is not None:
            mine = [s for s in samples if int(s.pid) in pids]
            util = float(min(sum(int(s.smUtil) for s in mine), 100))
            if samples:
                self._last_seen[index] = max(int(s.timeStamp) for s in samples)
        processes = self._ask(index, "processes", partial(nvml.nvmlDeviceGetComputeRunningProcesses, handle))
        memory = None
        if processes is not None:
            memory = sum(float(p.usedGpuMemory or 0) for p in processes if int(p.pid) in pids) / 2**20
        return util, memory

    def close(self) -> None:
        with contextlib.suppress(self.nvml.NVMLError):
            self.nvml.nvmlShutdown()


def open_reader(env: dict[str, str]) -> GpuReader:
    """The job's GPU reader: ``BROKER_GPU_SAMPLER``'s if set, else NVML's. Raises SamplingUnavailable."""
    devices = visible_devices(env)
    if devices == []:
        raise SamplingUnavailable("the job sees no GPU (CUDA_VISIBLE_DEVICES is empty)")
    spec = env.get(SAMPLER_VARIABLE, "").strip()
    if not spec:
        return NvmlReader(devices)
    if not _SAMPLER.match(spec):
        raise SamplingUnavailable(f"{SAMPLER_VARIABLE}: expected module:callable, got {spec[:80]!r}")
    module_name, _, name = spec.partition(":")
    try:
        factory = getattr(importlib.import_module(module_name), name)
        reader = factory(devices)
    except SamplingUnavailable:
        raise
    except Exception as exc:  # a user's sampler may fail in any way; the job must not
        raise SamplingUnavailable(f"{SAMPLER_VARIABLE}={spec}: {type(exc).__name__}: {str(exc)[:200]}") from None
    if not callable(getattr(reader, "read", None)):
        raise SamplingUnavailable(f"{SAMPLER_VARIABLE}={spec}: the reader it returned has no read(pids)")
    return reader  # type: ignore[no-any-return]


def job_pids(session: int) -> frozenset[int]:
    """The processes of the job's session (it runs in its own): those whose GPU share is the job's."""
    pids = set()
    try:
        entries = os.listdir("/proc")
    except OSError:
        return frozenset()
    for entry in entries:
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as handle:
                stat = handle.read(4096)
        except OSError:
            continue
        fields = stat[stat.rfind(b")") + 2:].split()
        if len(fields) > 3 and fields[3] == str(session).encode():
            pids.add(int(entry))
    return frozenset(pids)


def finite(value: float | None, low: float = 0.0, high: float = math.inf) -> float | None:
    """A reading kept only when it is a finite number in range (a sampler may return anything)."""
    if value is None or isinstance(value, bool) or not isinstance(value, int | float):
        return None
    value = float(value)
    return value if math.isfinite(value) and low <= value <= high else None
