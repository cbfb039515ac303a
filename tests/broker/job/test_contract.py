"""The dependency-free helper: the signal, atomic saves, the marker, progress, resuming, hostile files."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from broker.agent.checkpoint import latest_checkpoint
from broker.agent.progress import parse_line
from broker.job import Checkpointer, read_marker

ROOT = Path(__file__).resolve().parents[3]


def write_text(text: str):
    def write(path: str) -> None:
        Path(path).write_text(text)
    return write


@pytest.fixture
def fresh(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    for name in ("BROKER_RESUME_FROM", "BROKER_CHECKPOINT_DIR", "BROKER_CHECKPOINT_SIGNAL", "RANK",
                 "SKYPILOT_NODE_RANK"):
        monkeypatch.delenv(name, raising=False)
    return tmp_path / "ckpt"


def test_signal_asks_for_one_checkpoint_and_the_agent_reads_the_marker(fresh: Path, capsys) -> None:
    ckpt = Checkpointer(fresh, total_steps=10)
    try:
        assert not ckpt.should_save(1)
        os.kill(os.getpid(), signal.SIGUSR1)
        assert ckpt.asked
        assert ckpt.should_save(2) and not ckpt.should_save(3)  # one request, one checkpoint
        assert ckpt.save(2, write_text("two"))
        ckpt.progress(2)
    finally:
        signal.signal(signal.SIGUSR1, signal.SIG_DFL)
    mark = latest_checkpoint(fresh)  # what the node agent reports to the broker
    assert mark is not None and mark.step == 2 and Path(mark.path).read_text() == "two"
    assert Path(mark.path).name == "step-00000002"
    assert "save_seconds=" in (fresh / "LATEST").read_text()
    out = capsys.readouterr().out
    assert "checkpoint step-00000002 (on notice) saved in" in out
    [progress] = [parse_line(line.encode()) for line in out.splitlines() if line.startswith("BROKER_PROGRESS")]
    assert progress is not None and (progress.step, progress.total) == (2, 10)
    assert len(ckpt.save_seconds) == 1 and ckpt.save_seconds[0] >= 0


def test_signal_named_by_the_agent_and_a_previous_handler_still_runs(fresh: Path, monkeypatch) -> None:
    monkeypatch.setenv("BROKER_CHECKPOINT_SIGNAL", "SIGUSR2")
    seen: list[int] = []
    signal.signal(signal.SIGUSR2, lambda signum, _frame: seen.append(signum))
    try:
        ckpt = Checkpointer(fresh)
        os.kill(os.getpid(), signal.SIGUSR2)
        assert ckpt.should_save(1) and seen == [signal.SIGUSR2]
    finally:
        signal.signal(signal.SIGUSR2, signal.SIG_DFL)


def test_periodic_checkpoints_and_only_the_newest_are_kept(fresh: Path) -> None:
    ckpt = Checkpointer(fresh, every_steps=3, keep=2, handle_signal=False)
    saved = [step for step in range(1, 13) if ckpt.should_save(step) and ckpt.save(step, write_text(str(step)))]
    assert saved == [3, 6, 9, 12]
    assert sorted(p.name for p in fresh.iterdir()) == ["LATEST", "step-00000009", "step-00000012"]
    assert read_marker(fresh) == ((fresh / "step-00000012").resolve(), 12)


def test_agreement_makes_every_rank_save_and_only_the_writer_marks(fresh: Path) -> None:
    flags: list[bool] = []
    ranks = [Checkpointer(fresh, rank=r, agree=lambda f: any([*flags, f]), handle_signal=False) for r in (0, 1)]
    ranks[1].ask()  # the signal reached rank 1 only
    flags.append(ranks[1].asked)
    assert [c.should_save(5) for c in ranks] == [True, True]
    assert (ranks[0].rank, ranks[0].writer_rank) == (0, 0)
    assert ranks[1].save(5, write_text("never")) and not fresh.exists()  # rank 1 writes nothing
    assert ranks[0].save(5, write_text("five"))
    assert read_marker(fresh) == ((fresh / "step-00000005").resolve(), 5)


def test_a_save_that_dies_half_way_never_becomes_the_resume_point(fresh: Path, monkeypatch, capsys) -> None:
    ckpt = Checkpointer(fresh, handle_signal=False)
    assert ckpt.save(4, write_text("good"))

    def dies(path: str) -> None:
        Path(path).write_text("half")
        raise OSError(28, "No space left on device")

    assert not ckpt.save(8, dies)
    assert "checkpoint step 8 not saved: OSError" in capsys.readouterr().err
    assert read_marker(fresh) == ((fresh / "step-00000004").resolve(), 4)
    assert sorted(p.name for p in fresh.iterdir()) == ["LATEST", "step-00000004"]
    # A process killed in the middle of a save leaves only its partial file: never a candidate.
    (fresh / ".step-00000009.partial").write_text("torn")
    monkeypatch.setenv("BROKER_RESUME_FROM", str(fresh / "step-00000004"))
    assert Checkpointer(fresh, handle_signal=False).resume(lambda p: Path(p).read_text()) == "good"


def test_a_checkpoint_that_does_not_load_falls_back_to_the_one_before(fresh: Path, monkeypatch, capsys) -> None:
    ckpt = Checkpointer(fresh, keep=3, handle_signal=False)
    for step in (1, 2, 3):
        ckpt.save(step, write_text(json.dumps(step)))
    (fresh / "step-00000003").write_text("{truncated")
    monkeypatch.setenv("BROKER_RESUME_FROM", str(fresh / "step-00000003"))
    resumed = Checkpointer(fresh, handle_signal=False)
    assert resumed.resume(lambda p: json.loads(Path(p).read_text())) == 2
    assert resumed.resumed_from is not None and resumed.resumed_from.name == "step-00000002"
    assert "cannot resume from step-00000003: JSONDecodeError" in capsys.readouterr().err


# NUL cannot be in the environment; an undecodable byte (a surrogate here) can.
@pytest.mark.parametrize("named", ["/etc/passwd", "../../outside", "step-00000099", "step-0\udcff", "x" * 5000])
def test_resume_from_outside_or_missing_resumes_from_the_last_good_one(fresh: Path, monkeypatch, capsys,
                                                                       named: str) -> None:
    Checkpointer(fresh, handle_signal=False).save(7, write_text("seven"))
    monkeypatch.setenv("BROKER_RESUME_FROM", named)
    assert Checkpointer(fresh, handle_signal=False).resume(lambda p: Path(p).read_text()) == "seven"
    assert "not resuming from it" in capsys.readouterr().err


@pytest.mark.parametrize("marker", [b"/etc/passwd\nstep=3\n", b"../x\n", b"", b"\x00\x00", b"step-00000005\nstep=zz\n",
                                    b"step-00000005\nstep=-4\n", b"step-00000005\nstep=" + b"9" * 5000 + b"\n",
                                    b"\xff\xfe" * 3000])
def test_a_hostile_marker_is_named_on_the_log_and_never_followed_outside(fresh: Path, capsys, marker: bytes) -> None:
    fresh.mkdir()
    (fresh / "step-00000005").write_text("five")
    (fresh / "LATEST").write_bytes(marker)
    found = read_marker(fresh)
    if marker.startswith(b"step-00000005\nstep="):
        assert found == ((fresh / "step-00000005").resolve(), 5)  # the name's step, not the garbage
    else:
        assert found is None
    assert "broker.job:" in capsys.readouterr().err


def test_an_unwritable_directory_is_said_once_per_save_and_training_goes_on(tmp_path: Path, fresh, capsys) -> None:
    blocked = tmp_path / "file-not-dir"
    blocked.write_text("")
    ckpt = Checkpointer(blocked / "ckpt", every_steps=1, handle_signal=False)
    assert ckpt.should_save(1) and not ckpt.save(1, write_text("x"))
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "checkpoint step 1 not saved" in err


def test_outside_the_broker_nothing_is_resumed_and_no_signal_is_needed(fresh: Path) -> None:
    ckpt = Checkpointer(fresh, handle_signal=False)
    ckpt.save(3, write_text("x"))
    assert Checkpointer(fresh, handle_signal=False).resume(lambda p: p) is None  # no BROKER_RESUME_FROM


def test_the_helper_imports_nothing_beyond_the_standard_library() -> None:
    code = ("import sys; before = set(sys.modules); import broker.job, broker.job.contract; "
            "extra = {m.split('.')[0] for m in set(sys.modules) - before} - set(sys.stdlib_module_names) - {'broker'}; "
            "print(sorted(extra))")
    result = subprocess.run([sys.executable, "-I", "-c", code], cwd=ROOT, capture_output=True, text=True, check=True,
                            env={"PYTHONPATH": str(ROOT)})
    assert result.stdout.strip() == "[]"


@pytest.mark.parametrize("name", ["SIGNOPE", "x" * 10_000, "usr\udcff", ""])
def test_a_garbage_signal_name_falls_back_to_sigusr1_with_one_line(fresh: Path, monkeypatch, capsys,
                                                                   name: str) -> None:
    monkeypatch.setenv("BROKER_CHECKPOINT_SIGNAL", name)
    assert Checkpointer(fresh, handle_signal=False).signal == signal.SIGUSR1
    err = capsys.readouterr().err
    assert err.count("\n") <= 1 and len(err) < 200


@pytest.mark.parametrize(("field", "value"), [("every_steps", 0), ("keep", 0)])
def test_out_of_range_settings_are_refused_naming_them(fresh: Path, field: str, value: int) -> None:
    with pytest.raises(ValueError, match=field):
        Checkpointer(fresh, handle_signal=False, **{field: value})  # type: ignore[arg-type]
