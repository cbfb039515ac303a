"""A stand-in for NVIDIA's ``pynvml`` (nvidia-ml-py) at the hardware boundary: no GPU, same API.

Put this folder first on ``PYTHONPATH`` and ``import pynvml`` finds it. It replays readings from
the JSON file named by ``FAKE_NVML_READINGS``::

    {"devices": [{"uuid": "GPU-0000", "memory_total_mb": 81920,
                  "readings": [{"gpu": 3, "memory": 1, "used_mb": 1200, "power_w": 70.5}],
                  "unsupported": ["power"],
                  "processes": [{"pid": 1234, "sm": 40, "mem": 5, "used_mb": 900}]}],
     "init_error": null}

Each ``nvmlDeviceGetUtilizationRates`` call moves that GPU to its next reading (cycling); the
other queries answer from the current one. Return types are those of the real bindings (ctypes
structures with the same fields, bytes-free strings, milliwatts, bytes), and errors are
``NVMLError`` subclasses with NVML's codes: a query a device lists as unsupported, and every
function this stand-in does not implement, raises ``NVMLError_NotSupported`` as real NVML does on
some GPUs. ``init_error`` (an NVML code, e.g. 12 "library not found") makes ``nvmlInit`` fail.
"""

from __future__ import annotations

import json
import os
import threading
from ctypes import Structure, c_uint, c_ulonglong
from typing import Any, ClassVar

NVML_SUCCESS = 0
NVML_ERROR_UNINITIALIZED = 1
NVML_ERROR_INVALID_ARGUMENT = 2
NVML_ERROR_NOT_SUPPORTED = 3
NVML_ERROR_NO_PERMISSION = 4
NVML_ERROR_NOT_FOUND = 6
NVML_ERROR_DRIVER_NOT_LOADED = 9
NVML_ERROR_LIBRARY_NOT_FOUND = 12
NVML_ERROR_GPU_IS_LOST = 15
NVML_ERROR_UNKNOWN = 999

_STRINGS = {
    NVML_ERROR_UNINITIALIZED: "Uninitialized", NVML_ERROR_INVALID_ARGUMENT: "Invalid Argument",
    NVML_ERROR_NOT_SUPPORTED: "Not Supported", NVML_ERROR_NO_PERMISSION: "Insufficient Permissions",
    NVML_ERROR_NOT_FOUND: "Not Found", NVML_ERROR_DRIVER_NOT_LOADED: "Driver Not Loaded",
    NVML_ERROR_LIBRARY_NOT_FOUND: "NVML Shared Library Not Found", NVML_ERROR_GPU_IS_LOST: "GPU is lost",
    NVML_ERROR_UNKNOWN: "Unknown Error",
}


class NVMLError(Exception):
    """As in pynvml: ``NVMLError(code)`` is an instance of the code's subclass, with ``.value``."""

    _valClassMapping: ClassVar[dict[int, type[NVMLError]]] = {}
    value: int

    def __new__(cls, value: int) -> NVMLError:
        if cls is NVMLError:
            cls = NVMLError._valClassMapping.get(value, cls)
        obj = Exception.__new__(cls)
        obj.value = value
        return obj

    def __str__(self) -> str:
        return _STRINGS.get(self.value, f"NVML Error with code {self.value}")

    def __eq__(self, other: object) -> bool:
        return isinstance(other, NVMLError) and self.value == other.value

    def __hash__(self) -> int:
        return hash(self.value)


def _subclass(name: str, code: int) -> type[NVMLError]:
    def new(cls: type[NVMLError], *_args: Any) -> NVMLError:
        return NVMLError.__new__(cls, code)

    made = type(name, (NVMLError,), {"__new__": new})
    NVMLError._valClassMapping[code] = made
    return made


NVMLError_Uninitialized = _subclass("NVMLError_Uninitialized", NVML_ERROR_UNINITIALIZED)
NVMLError_InvalidArgument = _subclass("NVMLError_InvalidArgument", NVML_ERROR_INVALID_ARGUMENT)
NVMLError_NotSupported = _subclass("NVMLError_NotSupported", NVML_ERROR_NOT_SUPPORTED)
NVMLError_NoPermission = _subclass("NVMLError_NoPermission", NVML_ERROR_NO_PERMISSION)
NVMLError_NotFound = _subclass("NVMLError_NotFound", NVML_ERROR_NOT_FOUND)
NVMLError_DriverNotLoaded = _subclass("NVMLError_DriverNotLoaded", NVML_ERROR_DRIVER_NOT_LOADED)
NVMLError_LibraryNotFound = _subclass("NVMLError_LibraryNotFound", NVML_ERROR_LIBRARY_NOT_FOUND)
NVMLError_GpuIsLost = _subclass("NVMLError_GpuIsLost", NVML_ERROR_GPU_IS_LOST)
NVMLError_Unknown = _subclass("NVMLError_Unknown", NVML_ERROR_UNKNOWN)


class c_nvmlUtilization_t(Structure):
    _fields_ = [("gpu", c_uint), ("memory", c_uint)]


class c_nvmlMemory_t(Structure):
    _fields_ = [("total", c_ulonglong), ("free", c_ulonglong), ("used", c_ulonglong)]


class c_nvmlProcessUtilizationSample_t(Structure):
    _fields_ = [("pid", c_uint), ("timeStamp", c_ulonglong), ("smUtil", c_uint), ("memUtil", c_uint),
                ("encUtil", c_uint), ("decUtil", c_uint)]


class nvmlFriendlyObject:
    def __init__(self, values: dict[str, Any]) -> None:
        for key, value in values.items():
            setattr(self, key, value)


class c_nvmlDevice_t:
    def __init__(self, index: int) -> None:
        self.index = index


_lock = threading.Lock()
_state: dict[str, Any] = {"devices": None, "cursor": {}, "calls": 0}


def _devices() -> list[dict[str, Any]]:
    if _state["devices"] is None:
        raise NVMLError(NVML_ERROR_UNINITIALIZED)
    devices: list[dict[str, Any]] = _state["devices"]
    return devices


def _device(handle: c_nvmlDevice_t) -> dict[str, Any]:
    devices = _devices()
    if not isinstance(handle, c_nvmlDevice_t) or not 0 <= handle.index < len(devices):
        raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
    return devices[handle.index]


def _answers(device: dict[str, Any], query: str) -> None:
    if query in device.get("unsupported", ()):
        raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
    if device.get("lost"):
        raise NVMLError(NVML_ERROR_GPU_IS_LOST)


def _reading(handle: c_nvmlDevice_t) -> dict[str, Any]:
    device = _device(handle)
    readings = device.get("readings") or [{}]
    reading: dict[str, Any] = readings[_state["cursor"].get(handle.index, 0) % len(readings)]
    return reading


def nvmlInit() -> None:
    with _lock:
        path = os.environ.get("FAKE_NVML_READINGS")
        data: dict[str, Any] = {"devices": []}
        if path:
            with open(path) as handle:
                data = json.load(handle)
        if data.get("init_error"):
            raise NVMLError(int(data["init_error"]))
        _state["devices"] = list(data.get("devices", []))
        _state["cursor"] = {}


def nvmlShutdown() -> None:
    with _lock:
        _state["devices"] = None


def nvmlDeviceGetCount() -> int:
    return len(_devices())


def nvmlDeviceGetHandleByIndex(index: int) -> c_nvmlDevice_t:
    if not 0 <= int(index) < len(_devices()):
        raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
    return c_nvmlDevice_t(int(index))


def nvmlDeviceGetHandleByUUID(uuid: str | bytes) -> c_nvmlDevice_t:
    text = uuid.decode() if isinstance(uuid, bytes) else uuid
    for index, device in enumerate(_devices()):
        if device.get("uuid") == text:
            return c_nvmlDevice_t(index)
    raise NVMLError(NVML_ERROR_NOT_FOUND)


def nvmlDeviceGetIndex(handle: c_nvmlDevice_t) -> int:
    _device(handle)
    return handle.index


def nvmlDeviceGetUUID(handle: c_nvmlDevice_t) -> str:
    return str(_device(handle).get("uuid", f"GPU-fake-{handle.index}"))


def nvmlDeviceGetName(handle: c_nvmlDevice_t) -> str:
    return str(_device(handle).get("name", "NVIDIA Fake"))


def nvmlDeviceGetUtilizationRates(handle: c_nvmlDevice_t) -> c_nvmlUtilization_t:
    _answers(_device(handle), "utilization")
    with _lock:
        _state["cursor"][handle.index] = _state["cursor"].get(handle.index, -1) + 1
        _state["calls"] += 1
    reading = _reading(handle)
    return c_nvmlUtilization_t(int(reading.get("gpu", 0)), int(reading.get("memory", 0)))


def nvmlDeviceGetMemoryInfo(handle: c_nvmlDevice_t, version: int | None = None) -> c_nvmlMemory_t:
    device = _device(handle)
    _answers(device, "memory")
    total = int(device.get("memory_total_mb", 16384)) * 2**20
    used = int(_reading(handle).get("used_mb", 0)) * 2**20
    return c_nvmlMemory_t(total, max(total - used, 0), used)


def nvmlDeviceGetPowerUsage(handle: c_nvmlDevice_t) -> int:
    _answers(_device(handle), "power")
    return int(float(_reading(handle).get("power_w", 0.0)) * 1000)  # milliwatts, as NVML


def nvmlDeviceGetComputeRunningProcesses(handle: c_nvmlDevice_t) -> list[nvmlFriendlyObject]:
    device = _device(handle)
    _answers(device, "processes")
    return [nvmlFriendlyObject({"pid": int(p["pid"]), "usedGpuMemory": int(p.get("used_mb", 0)) * 2**20,
                                "gpuInstanceId": 0xFFFFFFFF, "computeInstanceId": 0xFFFFFFFF})
            for p in device.get("processes", [])]


def nvmlDeviceGetProcessUtilization(handle: c_nvmlDevice_t, timeStamp: int) -> list[Any]:
    device = _device(handle)
    _answers(device, "process_utilization")
    stamp = int(_state["calls"]) * 1_000_000
    if stamp <= int(timeStamp) or not device.get("processes"):
        raise NVMLError(NVML_ERROR_NOT_FOUND)  # no sample since timeStamp, as NVML says it
    return [c_nvmlProcessUtilizationSample_t(int(p["pid"]), stamp, int(p.get("sm", 0)), int(p.get("mem", 0)), 0, 0)
            for p in device["processes"]]


def __getattr__(name: str) -> Any:
    """Every other NVML query: "not supported", as real NVML answers on GPUs that lack it."""
    if name.startswith("nvml"):
        def unsupported(*_args: Any, **_kwargs: Any) -> Any:
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
        return unsupported
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


