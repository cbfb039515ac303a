"""The docs a new user follows: every example is a file, every marked command and snippet runs and
prints what the page shows (its shape: ids, numbers and column widths change from run to run), the
site builds strictly, and the README stays short. Generic over README.md and docs/**/*.md, so a new
page is checked as soon as it exists."""

from __future__ import annotations

import contextlib
import itertools
import os
import re
import shlex
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.docs.docs_pages import (
    EXAMPLE_PATH,
    ROOT,
    Block,
    blocks,
    commands,
    ids,
    marks_outside_blocks,
    pages,
    shape_mismatch,
    shown_commands,
)

BIN = Path(sys.executable).parent
TRACES = ROOT.parent / "shared" / "traces"
EXPORT_OUTPUT = re.compile(r"^export (\w+)=\$\((.+)\)$")
FAILED_JOB = re.compile(r"^j-[0-9a-f]{8} .*: (FAILED|CANCELLED)$")
RUN_TIMEOUT_S = 600


def _page_id(page: Path) -> str:
    return str(page.relative_to(ROOT))


def test_every_example_a_page_names_is_a_file_in_the_repository() -> None:
    missing = []
    for page in pages():
        for n, line in enumerate(page.read_text().splitlines(), 1):
            for path in EXAMPLE_PATH.findall(line):
                if not (ROOT / path).exists():
                    missing.append(f"{_page_id(page)}:{n}: {path}")
    assert not missing, "examples the docs name but the repository lacks:\n" + "\n".join(missing)


def test_a_block_that_names_its_example_file_shows_that_file() -> None:
    """A block opening with ``# examples/PATH`` shows the file: the same YAML data, or the same text."""
    checked = 0
    for page in pages():
        for block in blocks(page):
            first = block.text.lstrip().split("\n", 1)[0]
            if not first.startswith("# examples/"):
                continue
            path = ROOT / first[2:].split()[0]
            assert path.is_file(), f"{block.where}: {path}"
            if path.suffix == ".yaml":
                assert yaml.safe_load(block.text) == yaml.safe_load(path.read_text()), block.where
            else:
                assert block.text.split("\n", 1)[1].strip() == path.read_text().strip(), block.where
            checked += 1
    assert checked >= 4


@pytest.mark.parametrize("path", sorted((ROOT / "examples" / "settings").glob("*.yaml")), ids=lambda p: p.name)
def test_every_example_settings_file_is_read_by_the_settings_model(path: Path) -> None:
    from broker.config.settings import load_settings

    load_settings(path)


def test_every_check_mark_marks_a_block() -> None:
    bad = [problem for page in pages() for problem in marks_outside_blocks(page)]
    assert not bad, "\n".join(bad)


def test_the_tests_a_block_names_exist() -> None:
    for page in pages():
        for block in blocks(page):
            if block.mark and block.mark.startswith("tested: "):
                for path in block.mark.removeprefix("tested: ").split(","):
                    assert (ROOT / path.strip()).is_file(), f"{block.where}: {path.strip()}"


def test_a_printed_block_follows_a_python_snippet_that_runs() -> None:
    for page in pages():
        found = blocks(page)
        for before, block in itertools.pairwise(found):
            if block.mark == "printed":
                assert before.lang == "python" and before.mark == "run", block.where


def test_the_readme_is_short_and_keeps_its_two_commands() -> None:
    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) < 300
    assert "bash scripts/setup.sh && .venv/bin/broker launch examples/quickstart.yaml" in readme
    assert "bash scripts/test.sh" in readme
    # The test command CI runs is the README's.
    assert "bash scripts/test.sh" in (ROOT / ".ci" / "run").read_text()


def test_every_command_of_the_readme_is_run_or_says_why_not() -> None:
    unmarked = [b.where for b in blocks(ROOT / "README.md") if shown_commands(b) and b.mark is None]
    assert not unmarked, f"README blocks with commands but no check mark: {unmarked}"
    shown = sum(shown_commands(b) for b in blocks(ROOT / "README.md"))
    run = sum(shown_commands(b) for b in blocks(ROOT / "README.md")
              if b.mark == "run" or (b.mark or "").startswith("tested: "))
    assert run == shown, f"{run} of the README's {shown} commands are run by a test"


def test_nine_in_ten_commands_the_docs_show_are_run_by_a_test() -> None:
    """Marked ``run`` (here) or ``tested:`` (by the tests named); the rest say why they are not."""
    shown = run = 0
    for page in pages():
        for block in blocks(page):
            shown += shown_commands(block)
            if block.mark == "run" or (block.mark or "").startswith("tested: "):
                run += shown_commands(block)
    assert run >= 0.9 * shown, f"{run} of the {shown} commands the docs show are run by a test"


@pytest.mark.slow
def test_the_site_builds_strictly(tmp_path: Path) -> None:
    done = subprocess.run([str(BIN / "mkdocs"), "build", "--strict", "--site-dir", str(tmp_path / "site")],
                          cwd=ROOT, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "NO_MKDOCS_2_WARNING": "1"})
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    for page in ["index.html", "reference/settings/index.html", "reference/cli/index.html",
                 "reference/api/index.html", "reference/metrics/index.html", "reference/job-file/index.html"]:
        assert (tmp_path / "site" / page).is_file(), page
    home = (tmp_path / "site" / "index.html").read_text()
    assert "Two commands" in home and "scripts/test.sh" in home
    assert "BROKER_START_RETRIES" in (tmp_path / "site" / "reference" / "settings" / "index.html").read_text()


def _runnable_pages() -> list[Path]:
    return [p for p in pages() if any(b.mark == "run" for b in blocks(p))]


def _env(home: Path) -> dict[str, str]:
    """A new user's environment: an empty HOME (so the broker home is ~/.broker), no BROKER_* settings."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("BROKER_")}
    env.update(HOME=str(home), PATH=f"{BIN}{os.pathsep}{env.get('PATH', '')}", NO_COLOR="1",
               PYTHONDONTWRITEBYTECODE="1")
    return env


def _export_output(command: str, env: dict[str, str]) -> str | None:
    """``export NAME=$(COMMAND)``: runs COMMAND, keeps its output in NAME; returns what it printed on stderr."""
    found = EXPORT_OUTPUT.match(command.split(" #")[0].strip())
    if not found:
        return None
    done = subprocess.run(["bash", "-c", found.group(2)], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=RUN_TIMEOUT_S)
    assert done.returncode == 0, f"$ {command}\n{done.stderr[-2000:]}"
    env[found.group(1)] = done.stdout.strip()
    return done.stderr


def _apply_export(command: str, env: dict[str, str]) -> bool:
    """``export A=B C=D``: the page's later commands see them (each command runs in its own shell)."""
    words = shlex.split(command.split(" #")[0])
    if not words or words[0] != "export":
        return False
    for word in words[1:]:
        name, _, value = word.partition("=")
        env[name] = env["HOME"] + value[1:] if value.startswith("~/") else value
    return True


def _run_console(block: Block, env: dict[str, str], id_map: dict[str, str], last_rc: list[int],
                 background: list[subprocess.Popen[bytes]]) -> None:
    for command in commands(block):
        line = command.line
        for shown_id, real_id in id_map.items():
            line = line.replace(shown_id, real_id)
        bare = line.split(" #")[0].strip()
        if bare.endswith("&") and not bare.endswith("&&"):  # a service the page's later commands talk to
            background.append(subprocess.Popen(["bash", "-c", f"exec {bare[:-1]}"], cwd=ROOT, env=env,
                                               stdin=subprocess.DEVNULL, start_new_session=True))
            continue
        exported = _export_output(line, env)
        if exported is not None:
            printed, rc = exported, 0
        elif _apply_export(line, env):
            continue
        elif bare == "echo $?":
            printed, rc = f"{last_rc[0]}\n", 0
        else:
            done = subprocess.run(["bash", "-c", line], cwd=ROOT, env=env, stdout=subprocess.PIPE,
                                  stderr=subprocess.STDOUT, text=True, timeout=RUN_TIMEOUT_S)
            # the pages' HOME and checkout
            printed = done.stdout.replace(str(ROOT), "/home/me/spot-broker").replace(env["HOME"], "/home/me")
            rc = done.returncode
        last_rc[0] = rc
        problem = shape_mismatch(command.shown, printed)
        assert problem is None, f"{block.where}: $ {command.line}\n{problem}"
        # The CLI's contract: 0 when the job succeeded, 1 when it failed or was cancelled, 2 for bad input.
        expects_error = any(s.startswith("error:") or FAILED_JOB.search(s) for s in command.shown)
        assert (rc != 0) == expects_error, f"{block.where}: $ {command.line} exited {rc}\n{printed[-2000:]}"
        for shown_id, real_id in zip(ids("\n".join(command.shown)), ids(printed), strict=False):
            id_map.setdefault(shown_id, real_id)


def _stop(process: subprocess.Popen[bytes]) -> None:
    """A service the page started, with whatever it started in its session."""
    for sig, wait in ((signal.SIGTERM, 30), (signal.SIGKILL, 10)):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, sig)
        try:
            process.wait(timeout=wait)
            return
        except subprocess.TimeoutExpired:
            continue


def _run_python(snippets: list[tuple[Block, Block | None]], env: dict[str, str], tmp: Path) -> None:
    """A page's snippets run in one interpreter, in order, as a reader pasting them would."""
    separator = "<<<end of snippet>>>"
    script = "\n".join(f"{b.text}\nprint({separator!r})" for b, _ in snippets)
    (tmp / "snippets.py").write_text(script)
    done = subprocess.run([sys.executable, str(tmp / "snippets.py")], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=RUN_TIMEOUT_S)
    assert done.returncode == 0, f"{snippets[0][0].where}: {done.stderr[-3000:]}"
    outputs = done.stdout.split(separator + "\n")
    for (snippet, printed_block), printed in zip(snippets, outputs, strict=False):
        if printed_block is not None:
            problem = shape_mismatch(printed_block.text.splitlines(), printed)
            assert problem is None, f"{snippet.where}: {problem}"


@pytest.mark.slow
@pytest.mark.parametrize("page", _runnable_pages(), ids=_page_id)
def test_the_marked_commands_and_snippets_of_a_page_run_as_shown(page: Path, tmp_path: Path) -> None:
    home = tmp_path / "home"  # a new user's empty HOME: nothing from this machine's ~/.sky or ~/.broker
    home.mkdir()
    env = _env(home)
    found = blocks(page)
    snippets: list[tuple[Block, Block | None]] = []
    background: list[subprocess.Popen[bytes]] = []
    id_map: dict[str, str] = {}
    last_rc = [0]
    try:
        for i, block in enumerate(found):
            if block.mark != "run":
                continue
            if block.lang == "python":
                after = found[i + 1] if i + 1 < len(found) and found[i + 1].mark == "printed" else None
                snippets.append((block, after))
            elif "../shared/" in block.text and not TRACES.is_dir():
                continue  # the real traces beside the project: shown with them, checked where they are
            else:
                _run_console(block, env, id_map, last_rc, background)
        if snippets:
            _run_python(snippets, env, tmp_path)
    finally:
        for process in background:
            _stop(process)
        for cluster in home.glob(".broker*/local/clusters/*/"):
            (cluster / "terminate").touch()
