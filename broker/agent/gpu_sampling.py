"""Sampling the job's GPUs every few seconds, kept per minute (mean and peak), sent once per interval.

Each minute also counts its idle samples (the job's utilisation, or the whole GPU's where the driver
gives no per-process figure, below ``idle_below``): a job that is busy for part of a minute and idle
for the rest has its idle seconds counted, which a minute's mean alone would hide.

The sampler runs in its own thread beside the job. Each minute of wall time (UTC) becomes one
aggregate per GPU; the complete minutes go to the broker in one ``POST /v1/gpu`` per interval
(default a minute), not one request per sample. A report the broker does not take within a few
seconds is dropped: a broker that is down costs a gap in the figures, never the job's time. A
reader that fails stops the sampling, said once in the agent's events.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from broker.agent.gpu import GpuReader, GpuReading, SamplingUnavailable, finite
from broker.agent.reporting import Events, post_with_retry

SAMPLE_EVERY_S = 5.0
REPORT_EVERY_S = 60.0
SEND_WITHIN_S = 10.0
MAX_PENDING_MINUTES = 64  # per report: the newest kept when the broker was away
IDLE_BELOW = 0.10  # the broker's default ``gpu_idle_below``; it sends its own as BROKER_GPU_IDLE_BELOW

# The figures summed for a mean and kept at their peak (the report's names, GpuReading's attributes).
FIGURES = ("utilization", "memory_utilization", "memory_used_mb", "power_w", "job_utilization", "job_memory_mb")
HIGH = {"utilization": 100.0, "memory_utilization": 100.0, "job_utilization": 100.0}


IDLE_BELOW_VARIABLE = "BROKER_GPU_IDLE_BELOW"


def idle_below_from(env: dict[str, str], events: Events) -> float:
    """The broker's idle threshold from ``BROKER_GPU_IDLE_BELOW``; the default, said once, when it is not a share."""
    text = env.get(IDLE_BELOW_VARIABLE, "").strip()
    if not text:
        return IDLE_BELOW
    value = finite(_float(text[:40]), 0.0, 1.0)
    if value is None:
        events.write("gpu_idle_below_refused", variable=IDLE_BELOW_VARIABLE, value=text[:40], used=IDLE_BELOW)
        return IDLE_BELOW
    return value


def _float(text: str) -> float | None:
    try:
        return float(text)
    except ValueError:
        return None


@dataclass
class MinuteAggregate:
    """One GPU's samples in one wall-clock minute."""

    gpu: int
    uuid: str
    minute: int  # epoch seconds // 60
    idle_below: float = IDLE_BELOW  # a share of the GPU's time (0 to 1)
    samples: int = 0
    idle_samples: int | None = None  # None: no sample had a utilisation figure
    memory_total_mb: float | None = None

    def __post_init__(self) -> None:
        self.sums: dict[str, float] = {}
        self.counts: dict[str, int] = {}
        self.peaks: dict[str, float] = {}

    def add(self, reading: GpuReading) -> None:
        self.samples += 1
        for name in FIGURES:
            value = finite(getattr(reading, name), 0.0, HIGH.get(name, 1e9))
            if value is None:
                continue
            self.sums[name] = self.sums.get(name, 0.0) + value
            self.counts[name] = self.counts.get(name, 0) + 1
            self.peaks[name] = max(self.peaks.get(name, value), value)
        total = finite(reading.memory_total_mb, 0.0, 1e9)
        if total is not None:
            self.memory_total_mb = total
        job = finite(reading.job_utilization, 0.0, 100.0)
        utilization = job if job is not None else finite(reading.utilization, 0.0, 100.0)
        if utilization is not None:
            self.idle_samples = (self.idle_samples or 0) + int(utilization < self.idle_below * 100.0)

    def to_report(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "gpu": self.gpu, "uuid": self.uuid[:96],
            "minute": datetime.fromtimestamp(self.minute * 60, UTC).isoformat(),
            "samples": self.samples,
            "idle_samples": self.idle_samples,
            "memory_total_mb": self.memory_total_mb,
        }
        for name in FIGURES:
            count = self.counts.get(name, 0)
            out[f"{name}_mean"] = round(self.sums[name] / count, 3) if count else None
            out[f"{name}_max"] = round(self.peaks[name], 3) if count else None
        return out


class MinuteAggregator:
    """Readings in, one aggregate per GPU and minute out once the minute is over."""

    def __init__(self, idle_below: float = IDLE_BELOW) -> None:
        self.idle_below = idle_below
        self.open: dict[tuple[int, int], MinuteAggregate] = {}

    def add(self, at: float, readings: Sequence[GpuReading]) -> None:
        minute = int(at // 60)
        for reading in readings:
            key = (reading.gpu, minute)
            agg = self.open.get(key)
            if agg is None:
                agg = self.open[key] = MinuteAggregate(reading.gpu, reading.uuid, minute, self.idle_below)
            agg.add(reading)

    def complete(self, now: float | None) -> list[dict[str, Any]]:
        """The minutes over by ``now`` (every minute when None), taken out."""
        current = None if now is None else int(now // 60)
        done = [k for k in self.open if current is None or k[1] < current]
        return [self.open.pop(k).to_report() for k in sorted(done, key=lambda k: (k[1], k[0]))]


class GpuSampler:
    """The thread that samples, aggregates and reports; ``stop()`` sends what is left."""

    def __init__(self, open_reader: Callable[[], GpuReader], pids: Callable[[], frozenset[int]],
                 send: Callable[[list[dict[str, Any]]], object] | None, events: Events,
                 sample_s: float = SAMPLE_EVERY_S, report_s: float = REPORT_EVERY_S,
                 idle_below: float = IDLE_BELOW) -> None:
        self._open_reader, self._pids, self._send = open_reader, pids, send
        self.events = events
        self.sample_s, self.report_s = sample_s, report_s
        self.aggregator = MinuteAggregator(idle_below)
        self.pending: list[dict[str, Any]] = []
        self.failed: str | None = None
        self.cpu_s = 0.0  # this thread's CPU time spent sampling (the overhead benchmark reads it)
        self._stop = threading.Event()
        self._lock = threading.Lock()  # the aggregator and the pending minutes: the sampler and a notice
        self._thread: threading.Thread | None = None
        self._sending: threading.Thread | None = None
        self._reader: GpuReader | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="gpu-sampler", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = SEND_WITHIN_S) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=timeout)
        if self.failed is None:
            with self._lock:
                self.pending.extend(self.aggregator.complete(None))
                self._flush(wait=timeout)
        close = getattr(self._reader, "close", None)
        if callable(close):
            with contextlib.suppress(Exception):  # closing a reader that failed must not fail the agent
                close()

    def _run(self) -> None:
        try:
            self._reader = self._open_reader()
        except SamplingUnavailable as exc:
            self._give_up(str(exc))
            return
        last_report = time.time()
        while not self._stop.is_set():
            started = time.thread_time()
            try:
                self.sample_once(time.time())
            except SamplingUnavailable as exc:
                self._give_up(str(exc))
                return
            self.cpu_s += time.thread_time() - started
            now = time.time()
            if now - last_report >= self.report_s:
                last_report = now
                with self._lock:
                    self.pending.extend(self.aggregator.complete(now))
                    self._flush(wait=0.0)
            self._stop.wait(self.sample_s)

    def send_now(self) -> None:
        """Send every minute so far, the current one too, at once: the node may be taken away (a notice).

        The rest of the current minute is then not reported: the broker keeps the first report of a minute.
        """
        if self.failed is None:
            with self._lock:
                self.pending.extend(self.aggregator.complete(None))
                self._flush(wait=0.0)

    def sample_once(self, at: float) -> None:
        assert self._reader is not None
        try:
            readings = self._reader.read(self._pids())
        except SamplingUnavailable:
            raise
        except Exception as exc:  # a sampler's own bug stops the sampling, not the job
            raise SamplingUnavailable(f"reader failed: {type(exc).__name__}: {str(exc)[:200]}") from None
        with self._lock:
            self.aggregator.add(at, [r for r in readings if isinstance(r, GpuReading)][:64])

    def _give_up(self, reason: str) -> None:
        self.failed = reason
        self.events.write("gpu_sampling_unavailable", reason=reason[:300])

    def _flush(self, wait: float) -> None:
        """Send the pending minutes from a background thread unless one is still sending."""
        if self._send is None or not self.pending:
            self.pending = self.pending[-MAX_PENDING_MINUTES:] if self._send is not None else []
            return
        if self._sending is not None and self._sending.is_alive():
            self.pending = self.pending[-MAX_PENDING_MINUTES:]
            return
        batch, self.pending = self.pending[-MAX_PENDING_MINUTES:], []
        self._sending = threading.Thread(target=self._send, args=(batch,), name="gpu-report", daemon=True)
        self._sending.start()
        if wait > 0:
            self._sending.join(timeout=wait)


class GpuReporter:
    """Posts a batch of minutes for one job, attempt, cluster and node."""

    def __init__(self, broker_url: str, token: str | None, job_id: str, attempt: int, cluster_id: str,
                 node: str, events: Events) -> None:
        self.url = broker_url.rstrip("/") + "/v1/gpu"
        self.token = token
        self.base = {"job_id": job_id, "attempt": attempt, "cluster_id": cluster_id, "node": node}
        self.events = events

    def __call__(self, minutes: list[dict[str, Any]]) -> bool:
        return post_with_retry(self.url, self.token, {**self.base, "minutes": minutes}, time.time() + SEND_WITHIN_S,
                               self.events, "gpu", minutes=len(minutes))
