"""Simulate: replay a market trace (bundled or uploaded) for a job file under every policy, by `broker simulate`.

The upload is hostile input: the form is bounded in size, NUL bytes are refused, and the job and
trace are checked by the simulator's own command in a child process (bounded in time and memory),
whose one-line error comes back as one 422.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from broker.errors import UserError
from broker.web.html import e, table

MAX_FORM_BYTES = 8 * 1024 * 1024
TIMEOUT_S = 180
MEMORY_BYTES = 3 * 1024 ** 3
BUNDLED = {"quickstart": Path(__file__).resolve().parents[1] / "data" / "quickstart-market.csv"}
EXAMPLE_JOB = """\
name: finetune
num_nodes: 1
resources:
  accelerators: V100:1
run: python train.py
broker:
  work: 2h
  deadline: 5h
"""
PALETTE = ("#2f6fdb", "#e07b00", "#12a39a", "#8e44ad", "#c0392b", "#27ae60", "#d4ac0d", "#5d6d7e")
_running = threading.Lock()


class SimulateError(UserError, ValueError):
    def __init__(self, message: str, status: int) -> None:
        super().__init__(message)
        self.status = status


@dataclass(frozen=True)
class Outcome:
    report: dict[str, Any]
    timeline: list[dict[str, Any]]
    market: str


def _limit_memory() -> None:  # runs in the child before exec
    import resource

    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_BYTES, MEMORY_BYTES))


def check_form(form: dict[str, list[str]]) -> tuple[str, str, str]:
    """(job text, market choice, uploaded trace text); SimulateError names the bad field."""
    job = (form.get("job") or [""])[0]
    choice = (form.get("market") or ["quickstart"])[0]
    upload = (form.get("trace") or [""])[0]
    for name, value in (("job", job), ("trace", upload), ("market", choice)):
        if "\x00" in value:
            raise SimulateError(f"{name}: contains NUL bytes; expected text", 400)
    if not job.strip():
        raise SimulateError("job: expected a job file (YAML) with broker.work and broker.deadline", 400)
    if choice not in (*BUNDLED, "upload"):
        raise SimulateError(f"market: expected one of {', '.join((*BUNDLED, 'upload'))}", 400)
    if choice == "upload" and not upload.strip():
        raise SimulateError("trace: choose a market trace file (CSV) to upload", 400)
    return job, choice, upload


def run(job: str, choice: str, upload: str) -> Outcome:
    if not _running.acquire(blocking=False):
        raise SimulateError("simulate: another simulation is running; try again when it ends", 429)
    try:
        with tempfile.TemporaryDirectory(prefix="broker-sim-") as tmp:
            folder = Path(tmp)
            (folder / "job.yaml").write_text(job, encoding="utf-8")
            trace = BUNDLED.get(choice) or folder / "market.csv"
            if choice == "upload":
                trace.write_text(upload, encoding="utf-8")
            command = [sys.executable, "-m", "broker", "simulate", str(folder / "job.yaml"), "--market", str(trace),
                       "--json", "--timeline", str(folder / "timeline.jsonl")]
            try:
                done = subprocess.run(command, capture_output=True, text=True, timeout=TIMEOUT_S, cwd=folder,
                                      stdin=subprocess.DEVNULL, preexec_fn=_limit_memory)
            except subprocess.TimeoutExpired:
                raise SimulateError(f"simulate: took longer than {TIMEOUT_S} s; try a shorter trace or job",
                                    422) from None
            if done.returncode != 0:
                lines = [ln for ln in done.stderr.splitlines() if ln.strip()]
                message = (lines[-1] if lines else f"simulate: failed (exit {done.returncode})")
                for path, name in ((folder / "job.yaml", "job"), (trace, "market"), (folder, "")):
                    message = message.replace(str(path), name)
                raise SimulateError(message.removeprefix("error: ")[:400], 422)
            try:
                report = json.loads(done.stdout)
            except ValueError:
                raise SimulateError("simulate: the simulator printed no result", 502) from None
            timeline = [json.loads(line) for line in
                        (folder / "timeline.jsonl").read_text(encoding="utf-8").splitlines() if line.strip()]
        return Outcome(report, timeline, "uploaded trace" if choice == "upload" else f"bundled {choice} market")
    finally:
        _running.release()


def form_html(job: str = EXAMPLE_JOB, choice: str = "quickstart") -> str:
    options = "".join(f'<option value="{e(name)}"{" selected" if name == choice else ""}>bundled: {e(name)} '
                      f"({e(path.name)})</option>" for name, path in BUNDLED.items())
    options += f'<option value="upload"{" selected" if choice == "upload" else ""}>upload a CSV trace</option>'
    return (f'<form class="simulate" method="post" action="/simulate">'
            f'<label>Market <select name="market">{options}</select></label> '
            f'<label>trace file <input type="file" accept=".csv,text/csv" data-into="trace"></label>'
            f'<textarea name="trace" hidden></textarea>'
            f'<p><label>Job file (YAML, with broker.work and broker.deadline) '
            f'<input type="file" accept=".yaml,.yml" data-into="job"></label></p>'
            f'<textarea name="job" rows="10" cols="70">{e(job)}</textarea>'
            f'<p><button type="submit">Simulate every policy</button> '
            f"(runs <code>broker simulate</code>; a few seconds to a minute)</p></form>")


def _timeline_svg(timeline: list[dict[str, Any]], policies: list[str]) -> str:
    ticks: dict[str, list[tuple[int, str]]] = {p: [] for p in policies}
    first: dict[str, tuple[object, object]] = {}  # a policy's first run: single-zone ones run once per zone
    for line in timeline:
        name = line.get("policy")
        if name not in ticks:
            continue
        run_key = first.setdefault(str(name), (line.get("start"), line.get("zone")))
        if (line.get("start"), line.get("zone")) == run_key:
            ticks[str(name)].append((int(line["tick"]), str(line["location"])))
    every = sorted({loc for rows in ticks.values() for _, loc in rows})
    colour = {loc: ("#d0d3d4" if "idle" in loc else "#1d2733" if "demand" in loc else PALETTE[i % len(PALETTE)])
              for i, loc in enumerate(every)}
    lo = min((t for rows in ticks.values() for t, _ in rows), default=0)
    hi = max((t for rows in ticks.values() for t, _ in rows), default=1)
    span, width, parts = max(hi - lo + 1, 1), 760.0, []
    for row, name in enumerate(policies):
        y = 10 + 24 * row
        parts.append(f'<text x="4" y="{y + 14}" class="lane">{e(name)}</text>')
        rows = sorted(ticks[name])
        i = 0
        while i < len(rows):
            j = i
            while j + 1 < len(rows) and rows[j + 1][1] == rows[i][1] and rows[j + 1][0] == rows[j][0] + 1:
                j += 1
            x0 = 150 + width * (rows[i][0] - lo) / span
            x1 = 150 + width * (rows[j][0] + 1 - lo) / span
            parts.append(f'<rect x="{x0:.1f}" y="{y}" width="{max(x1 - x0, 0.5):.1f}" height="18" '
                         f'fill="{colour[rows[i][1]]}"><title>{e(name)}: {e(rows[i][1])}</title></rect>')
            i = j + 1
    legend = "".join(f'<span class="gpu" style="width:auto;padding:0 6px;background:{c}">{e(loc)}</span>'
                     for loc, c in colour.items())
    height = 20 + 24 * len(policies)
    return (f'<svg class="timeline sim" viewBox="0 0 {width + 160:.0f} {height}" width="100%">{"".join(parts)}'
            f"</svg><p>{legend}</p>")


def result_html(outcome: Outcome) -> str:
    rows = []
    for name, entry in outcome.report.items():
        mean = entry.get("mean", {})
        rows.append([e(name), e(f"${mean.get('cost', 0.0):,.2f}"), e(f"{mean.get('cost_vs_on_demand', 0.0):.3f}"),
                     e(f"{mean.get('preemptions', 0.0):.1f}"), e(f"{mean.get('migrations', 0.0):.1f}"),
                     e(f"{mean.get('finish_hours', 0.0):.1f}"), e(f"{mean.get('deadline_met', 0.0):.0%}")])
    return (f'<section id="sim-result"><h2>Each policy on the {e(outcome.market)}</h2>'
            + table(["policy", "cost", "vs on-demand", "preemptions", "migrations", "finish h", "deadline met"],
                    rows, 'class="sim"')
            + "<h3>Where each policy ran, tick by tick</h3>"
            + _timeline_svg(outcome.timeline, list(outcome.report)) + "</section>")
