"""On Azure the agent lets the eviction go ahead (StartRequests) once the job's checkpoint is safe."""

from __future__ import annotations

import email.utils
import json
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path

from tests.broker.agent.test_node import JOB, wait_until_ready
from tests.cloud_metadata import FakeAzureImds, azure_server


def test_azure_eviction_is_acknowledged_after_the_checkpoint(tmp_path: Path) -> None:
    state = FakeAzureImds(vm_name="node-0")
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    job = tmp_path / "job.py"
    job.write_text(JOB)
    status = tmp_path / "status"
    with azure_server(state) as metadata:
        # --cloud auto: the agent must find Azure by its metadata service.
        process = subprocess.Popen([sys.executable, "-m", "broker.agent", "--cloud", "auto", "--metadata-url",
                                    metadata, "--poll", "50ms", "--checkpoint-dir", str(ckpt),
                                    "--status-file", str(status), "--", sys.executable, str(job)])
        wait_until_ready(ckpt)
        not_before = email.utils.format_datetime(datetime.now(UTC) + timedelta(seconds=4), usegmt=True)
        event_id = state.preempt(["node-0"], not_before=not_before)
        code = process.wait(timeout=30)
    events = [json.loads(line) for line in Path(str(status) + ".events").read_text().splitlines()]
    kinds = [e["event"] for e in events]
    assert code == 3
    assert kinds.index("signaled") < kinds.index("checkpoint_complete") < kinds.index("acknowledged")
    assert state.posted == [{"StartRequests": [{"EventId": event_id}]}]
