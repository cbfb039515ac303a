"""The agent's work on a node: run the job, watch for notices, checkpoint, report, pass the exit code.

The job runs in its own process group. On a notice the agent sends the checkpoint signal to that
group at once (whether or not the broker answers), waits for the job to mark a checkpoint complete,
and reports the notice to the broker twice: as soon as it is seen (so the replacement starts) and
again with the checkpoint when it is complete. Reports retry until the notice's deadline.
A job none of whose processes catches the signal yet (still importing its framework) is not sent
it, since its default action would kill the job: the agent sends it once a handler is in place.

Whatever the reason, every new complete checkpoint the job marks is reported too
(``POST /v1/checkpoints``): the broker decides moves and resumes from what agents report, so a
checkpoint directory that is a mounted bucket works like a local one.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import subprocess
import tempfile
import threading
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from broker.agent import mps
from broker.agent.catching import may_send
from broker.agent.checkpoint import CheckpointMark, latest_checkpoint
from broker.agent.events import EventLog
from broker.agent.gpu import job_pids, open_reader
from broker.agent.gpu_sampling import REPORT_EVERY_S, SAMPLE_EVERY_S, GpuReporter, GpuSampler, idle_below_from
from broker.agent.jobpath import job_pythonpath, with_pythonpath
from broker.agent.progress import ProgressReporter, pass_through, read_progress_file
from broker.agent.reporting import Delivery, LatestOnly, post_until, post_with_retry
from providers.node_notice import NOTICE_POLL_SECONDS
from providers.notices import NodeNotice, NoticeReader, detect_cloud, reader_for

log = logging.getLogger("broker.agent")

# Give up waiting for a checkpoint this long before the node is taken away.
DEADLINE_MARGIN_SECONDS = 1.0
DEFAULT_WAIT_SECONDS = 120.0
LAST_CALL_MIN_SECONDS = 0.5
# While a notice waits for the job to install its checkpoint handler, look this often.
HANDLER_WAIT_SECONDS = 0.2


@dataclass
class AgentOptions:
    command: list[str]
    cloud: str = "auto"
    metadata_url: str | None = None
    broker_url: str | None = None
    token: str | None = None
    checkpoint_signal: signal.Signals = signal.SIGUSR1
    poll_seconds: float = 1.0
    notice_poll_seconds: float | None = None  # None: the cloud's own (providers.node_notice.NOTICE_POLL_SECONDS)
    cluster_id: str = ""
    node: str = "0"
    checkpoint_dir: str | None = None
    status_file: str | None = None
    env: dict[str, str] = field(default_factory=dict)
    gpu_sample_s: float = SAMPLE_EVERY_S
    gpu_report_s: float = REPORT_EVERY_S


class NoticeReporter:
    """Posts notices to the broker, retrying with backoff until the notice's deadline."""

    def __init__(self, broker_url: str | None, token: str | None, events: EventLog) -> None:
        self.url = broker_url.rstrip("/") + "/v1/notices" if broker_url else None
        self.token = token
        self.events = events

    def report(self, payload: dict[str, Any], deadline: float) -> bool:
        if self.url is None:
            return False
        return post_with_retry(self.url, self.token, payload, deadline, self.events, "notice",
                               names=("reported", "report_refused", "report_gave_up"),
                               checkpoint=payload.get("checkpoint"))


class CheckpointReporter:
    """Reports each new complete checkpoint the job marks; only the newest unsent one is kept.

    One the broker did not answer for within ``RETRY_SECONDS`` (its engine was killed and none has
    started yet) is sent again from the next poll on, unless a newer one replaced it.
    """

    RETRY_SECONDS = 60.0

    def __init__(self, broker_url: str | None, token: str | None, cluster_id: str, node: str,
                 job_id: str | None, checkpoint_dir: str | None, events: EventLog) -> None:
        self.url = broker_url.rstrip("/") + "/v1/checkpoints" if broker_url and job_id and checkpoint_dir else None
        self.token = token
        self.cluster_id, self.node, self.job_id = cluster_id, node, job_id
        self.checkpoint_dir = checkpoint_dir
        self.events = events
        self.last: CheckpointMark | None = latest_checkpoint(checkpoint_dir)  # a resumed job's old one is known
        self.undelivered: dict[str, Any] | None = None
        self.sender = LatestOnly(self._send)

    def watch(self) -> None:
        """Called every poll: report the marker if it names a checkpoint not reported yet."""
        if self.url is None:
            return
        mark = latest_checkpoint(self.checkpoint_dir)
        if mark is None or (self.last is not None and (mark.path, mark.step) == (self.last.path, self.last.step)):
            again, self.undelivered = self.undelivered, None
            if again is not None:
                self.sender.offer(again)
            return
        self.last = mark
        payload = self._payload(mark)
        if payload is not None:
            self.sender.offer(payload)

    def flush(self, timeout: float) -> None:
        self.sender.flush(timeout)

    def _payload(self, mark: CheckpointMark) -> dict[str, Any] | None:
        relative = self._relative(mark)
        if relative.startswith("..") or os.path.isabs(relative):
            self.events.write("checkpoint_outside_dir", path=mark.path)
            return None
        return {"job_id": self.job_id, "cluster_id": self.cluster_id, "node": self.node, "path": relative,
                "written_at": datetime.fromtimestamp(mark.written_at, UTC).isoformat(), "step": mark.step,
                "save_seconds": mark.save_seconds}

    def _relative(self, mark: CheckpointMark) -> str:
        assert self.checkpoint_dir is not None
        return os.path.relpath(mark.path, self.checkpoint_dir)

    def _send(self, payload: dict[str, Any]) -> None:
        assert self.url is not None
        outcome = post_until(self.url, self.token, payload, time.time() + self.RETRY_SECONDS, self.events,
                             "checkpoint", path=payload["path"], step=payload["step"])
        if outcome is Delivery.GAVE_UP and self.last is not None and payload["path"] == self._relative(self.last):
            self.undelivered = payload


class Agent:
    def __init__(self, options: AgentOptions, reader: NoticeReader | None) -> None:
        self.options = options
        self.reader = reader
        self.events = EventLog(options.status_file + ".events" if options.status_file else None)
        self.reporter = NoticeReporter(options.broker_url, options.token, self.events)
        self.checkpoint_dir = options.checkpoint_dir or os.environ.get("BROKER_CHECKPOINT_DIR")
        job_id = options.env.get("BROKER_JOB_ID") or os.environ.get("BROKER_JOB_ID")
        self.checkpoints = CheckpointReporter(options.broker_url, options.token, options.cluster_id, options.node,
                                              job_id, self.checkpoint_dir, self.events)
        self.progress = ProgressReporter(options.broker_url, options.token, options.cluster_id, options.node,
                                         job_id, self.events)
        self.progress_file = (options.status_file + ".progress" if options.status_file
                              else os.path.join(tempfile.gettempdir(), f"broker-progress-{os.getpid()}.json"))
        self.handled: set[str] = set()
        self.child: subprocess.Popen[bytes] | None = None
        self.pending: list[tuple[threading.Thread, float]] = []  # (thread, its deadline)
        self.gpu: GpuSampler | None = None

    def _start_gpu_sampling(self, env: dict[str, str]) -> None:
        """Sample the job's GPUs beside it, when there is a broker to tell and a job to tell about."""
        job_id, url = env.get("BROKER_JOB_ID"), self.options.broker_url
        if not job_id or not url:
            return
        try:
            attempt = int(env.get("BROKER_ATTEMPT", "0"))
        except ValueError:
            attempt = 0
        assert self.child is not None
        session = self.child.pid
        shared = bool(env.get("BROKER_GPU_SHARE"))
        reporter = GpuReporter(url, self.options.token, job_id, attempt, self.options.cluster_id,
                               self.options.node, self.events)
        self.gpu = GpuSampler(lambda: open_reader(env), lambda: job_pids(session) if shared else frozenset(),
                              reporter, self.events, self.options.gpu_sample_s, self.options.gpu_report_s,
                              idle_below_from(env, self.events))
        self.gpu.start()

    def run(self) -> int:
        env = {**os.environ, **self.options.env}
        if self.checkpoint_dir:
            env["BROKER_CHECKPOINT_DIR"] = self.checkpoint_dir
        env["BROKER_PROGRESS_FILE"] = self.progress_file
        env["BROKER_CHECKPOINT_SIGNAL"] = self.options.checkpoint_signal.name
        env = self._job_pythonpath(env)
        env.update(self._mps(env))
        self.child = subprocess.Popen(self.options.command, start_new_session=True, env=env,
                                      stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        assert self.child.stdout is not None
        output = pass_through(self.child.stdout, self.progress)
        self.events.write("started", pid=self.child.pid, command=self.options.command)
        self._start_gpu_sampling(env)
        if self.options.status_file:
            # The local cloud kills every process group recorded here when it takes the node away.
            Path(self.options.status_file + ".pgid").write_text(str(self.child.pid))
        for forwarded in (signal.SIGTERM, signal.SIGINT):
            signal.signal(forwarded, self._forward)
        # The metadata service is read every ``notice_poll`` (a fraction of a second: a notice reaches
        # the job that soon), the job's progress and checkpoint files every ``poll_seconds``.
        notice_poll = min(self.options.poll_seconds, self.options.notice_poll_seconds or NOTICE_POLL_SECONDS.get(
            getattr(self.reader, "cloud", ""), self.options.poll_seconds))
        watch_at = 0.0
        while self.child.poll() is None:
            if self.reader is not None:
                for notice in self.reader.poll():
                    self._on_notice(notice)
            if time.monotonic() >= watch_at:
                self._watch()
                watch_at = time.monotonic() + self.options.poll_seconds
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.child.wait(timeout=notice_poll)
        output.join(timeout=5.0)  # a daemon the job left behind may hold its output open
        if self.gpu is not None:
            self.gpu.stop()
        self._watch()
        self.checkpoints.flush(timeout=10.0)
        self.progress.flush(timeout=5.0)
        for thread, deadline in self.pending:  # let the last checkpoint's report get out
            thread.join(timeout=max(deadline - time.time(), 0.0))
        close = getattr(self.reader, "close", None)
        if close is not None:
            close()
        code = self.child.returncode
        exit_code = code if code >= 0 else 128 - code
        self.events.write("exited", exit_code=exit_code)
        if self.options.status_file:
            tmp = Path(self.options.status_file + ".tmp")
            tmp.write_text(json.dumps({"exit_code": exit_code, "finished_wall": time.time()}))
            os.replace(tmp, self.options.status_file)
        return exit_code

    def _job_pythonpath(self, env: dict[str, str]) -> dict[str, str]:
        """``import broker.job`` in the job without installing anything; a job runs without it too."""
        folder = (Path(self.options.status_file + ".pythonpath") if self.options.status_file
                  else Path(tempfile.gettempdir()) / f"broker-job-{os.getpid()}")
        try:
            return with_pythonpath(env, job_pythonpath(folder))
        except OSError as exc:
            self.events.write("job_helper_unavailable", reason=str(exc)[:300])
            return env

    def _mps(self, env: dict[str, str]) -> dict[str, str]:
        """NVIDIA MPS for a job sharing its GPU, where the node has it; without it the job still runs."""
        try:
            found = mps.share_env(env)
        except (mps.MpsError, OSError, subprocess.SubprocessError) as exc:
            self.events.write("mps_unavailable", reason=str(exc)[:300])
            return {}
        if found:
            self.events.write("mps", **found)
        return found

    def _watch(self) -> None:
        self.checkpoints.watch()
        self.progress.saw(read_progress_file(self.progress_file))
        self.progress.tick()

    def _forward(self, signum: int, _frame: object) -> None:
        if self.child is not None and self.child.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.child.pid, signum)

    def _on_notice(self, notice: NodeNotice) -> None:
        if notice.kind in self.handled:
            return
        self.handled.add(notice.kind)
        seen = time.time()
        self.events.write("notice_seen", kind=notice.kind, action_time=notice.action_time)
        if self.gpu is not None and notice.kind != "rebalance":
            self.gpu.send_now()  # the node may go before the minute is over
        if notice.kind == "rebalance":
            # A rebalance recommendation is advice, not a deadline: report it, keep the job running.
            threading.Thread(target=self.reporter.report, args=(self._payload(notice, seen, None, None),
                             seen + DEFAULT_WAIT_SECONDS), daemon=True).start()
            return
        before = latest_checkpoint(self.checkpoint_dir)
        signaled = self._send_checkpoint_signal("notice")
        if signaled is not None:
            self.events.write("signaled", signal=self.options.checkpoint_signal.name, delay_s=signaled - seen)
        deadline = notice.action_time.timestamp() if notice.action_time else seen + DEFAULT_WAIT_SECONDS
        for target, args in ((self.reporter.report, (self._payload(notice, seen, signaled, None), deadline)),
                             (self._checkpoint_and_report, (notice, seen, signaled, before, deadline))):
            thread = threading.Thread(target=target, args=args, daemon=True)  # type: ignore[arg-type]
            thread.start()
            self.pending.append((thread, deadline))

    def _send_checkpoint_signal(self, reason: str) -> float | None:
        """Send the checkpoint signal to the job's group; None when no process there catches it yet.

        The signal's default action would kill a job still importing its framework (or be lost on
        processes that inherited a wrapper shell's ``trap ''``): it waits for the handler instead.
        """
        assert self.child is not None
        signum = self.options.checkpoint_signal
        if not may_send(self.child.pid, signum):
            self.events.write("handler_missing", signal=signum.name, reason=reason)
            return None
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.child.pid, signum)
        return time.time()

    def _signal_when_handled(self, seen: float, until: float) -> float | None:
        """Send the notice's signal as soon as the job catches it; None if it never does in time."""
        assert self.child is not None
        signum = self.options.checkpoint_signal
        while time.time() < until and self.child.poll() is None:
            time.sleep(min(HANDLER_WAIT_SECONDS, max(until - time.time(), 0.0)))
            if may_send(self.child.pid, signum):
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.child.pid, signum)
                signaled = time.time()
                self.events.write("signaled", signal=signum.name, delay_s=signaled - seen, deferred=True)
                return signaled
        return None

    def _checkpoint_and_report(self, notice: NodeNotice, seen: float, signaled: float | None,
                               before: CheckpointMark | None, deadline: float) -> None:
        if self._checkpoints(notice, seen, signaled, before, deadline) and self.reader is not None:
            # The checkpoint is safe: let the cloud go ahead (Azure evicts at once instead of at NotBefore).
            self.reader.acknowledge(notice)
            self.events.write("acknowledged", kind=notice.kind)

    def _checkpoints(self, notice: NodeNotice, seen: float, signaled: float | None,
                     before: CheckpointMark | None, deadline: float) -> bool:
        """The checkpoint on the notice and the last call before its deadline; False if none came."""
        if signaled is None:
            signaled = self._signal_when_handled(seen, deadline - DEADLINE_MARGIN_SECONDS)
            if signaled is None:
                self.events.write("checkpoint_missing", reason="the job never installed its checkpoint handler")
                return False
        mark = self._wait_for_checkpoint(before, deadline - DEADLINE_MARGIN_SECONDS)
        if mark is None:
            self.events.write("checkpoint_missing")
            return False
        took = max(mark.written_at - signaled, 0.0)
        self.events.write("checkpoint_complete", path=mark.path, after_s=took)
        self.reporter.report(self._payload(notice, seen, signaled, mark), deadline)
        # Work done after that checkpoint would be lost: ask for one more just before the deadline,
        # leaving the job three times what its first checkpoint took.
        last_call = deadline - max(LAST_CALL_MIN_SECONDS, 3 * took)
        while time.time() < last_call:
            if self.child is None or self.child.poll() is not None:
                return True
            time.sleep(min(0.05, max(last_call - time.time(), 0.0)))
        if self.child is None or self.child.poll() is not None:
            return True
        again = self._send_checkpoint_signal("last_call")
        if again is None:
            return True
        final = self._wait_for_checkpoint(mark, deadline - 0.05)
        if final is not None:
            self.events.write("checkpoint_complete", path=final.path, after_s=final.written_at - again, last=True)
            self.reporter.report(self._payload(notice, seen, signaled, final), deadline)
        return True

    def _wait_for_checkpoint(self, before: CheckpointMark | None, until: float) -> CheckpointMark | None:
        while time.time() < until:
            mark = latest_checkpoint(self.checkpoint_dir)
            if mark is not None and (before is None or mark != before):
                return mark
            if self.child is not None and self.child.poll() is not None:
                return latest_checkpoint(self.checkpoint_dir)
            time.sleep(0.05)
        return None

    def _payload(self, notice: NodeNotice, seen: float, signaled: float | None,
                 mark: CheckpointMark | None) -> dict[str, Any]:
        return {
            "cluster_id": self.options.cluster_id,
            "node": self.options.node,
            "kind": notice.kind,
            "action_time": notice.action_time.isoformat() if notice.action_time else None,
            "noticed_at": datetime.fromtimestamp(seen, UTC).isoformat(),
            "signaled_at": datetime.fromtimestamp(signaled, UTC).isoformat() if signaled else None,
            "checkpoint": mark.path if mark else None,
            "checkpoint_at": datetime.fromtimestamp(mark.written_at, UTC).isoformat() if mark else None,
        }


def run_agent(options: AgentOptions) -> int:
    cloud = detect_cloud(options.metadata_url) if options.cloud == "auto" else options.cloud
    reader = None if cloud == "none" else reader_for(cloud, options.metadata_url)
    if reader is None:
        log.info("no cloud metadata service answered: running without notices")
    return Agent(options, reader).run()
