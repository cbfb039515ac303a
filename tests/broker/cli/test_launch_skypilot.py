"""launch's SkyPilot flags: refusals with exit 2 and nothing written."""

from __future__ import annotations

from pathlib import Path

import pytest

from broker.cli import main

JOB = "name: t\nresources:\n  accelerators: V100:1\nrun: python train.py\n"


@pytest.mark.parametrize(("args", "expected"), [
    (["--backend", "kubernetes"], "--backend kubernetes: expected local or skypilot"),
    (["--dryrun"], "--dryrun: only with --backend skypilot"),
])
def test_refused_flags(tmp_path: Path, broker_home: Path, capsys: pytest.CaptureFixture[str],
                       args: list[str], expected: str) -> None:
    job = tmp_path / "job.yaml"
    job.write_text(JOB)
    with pytest.raises(SystemExit) as exit_info:
        main(["launch", str(job), *args])
    assert exit_info.value.code == 2
    assert expected in capsys.readouterr().err
    assert not (broker_home / "broker.db").exists()


def test_backend_from_the_environment_is_honoured(tmp_path: Path, broker_home: Path, monkeypatch: pytest.MonkeyPatch,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("BROKER_BACKEND", "nimbus")
    job = tmp_path / "job.yaml"
    job.write_text(JOB)
    with pytest.raises(SystemExit) as exit_info:
        main(["launch", str(job)])
    assert exit_info.value.code == 2
    assert "--backend nimbus" in capsys.readouterr().err
