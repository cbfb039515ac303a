"""Job files written to hurt: each is refused with one line naming the field (and line), fast and in bounded memory."""

from __future__ import annotations

import subprocess
import sys
import tracemalloc
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from broker.spec.job import SpecError, parse_job_file, parse_job_spec

REPO = Path(__file__).resolve().parents[3]


def refused(text: str) -> SpecError:
    with pytest.raises(SpecError) as caught:
        parse_job_spec(text, source="job.yaml", offline=True)
    assert "\n" not in str(caught.value)
    return caught.value


def laughs(levels: int, width: int = 9) -> str:
    lines = ["run: x", "envs:", f"  l0: &l0 [{', '.join(['lol'] * width)}]"]
    for level in range(1, levels):
        lines.append(f"  l{level}: &l{level} [{', '.join([f'*l{level - 1}'] * width)}]")
    return "\n".join(lines) + "\n"


def test_billion_laughs_is_refused_at_the_alias_that_blows_up_in_bounded_memory() -> None:
    tracemalloc.start()
    try:
        error = refused(laughs(10))  # 9**10 (3.5 billion) strings once expanded
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert "aliases expand to more than 100,000 values" in str(error)
    assert error.line == 8 and error.field is not None and error.field.startswith("envs.l5")
    assert peak < 50_000_000


def test_a_few_aliases_are_fine() -> None:
    text = "run: x\nenvs: &e {A: '1'}\nresources:\n  any_of:\n    - &v {accelerators: V100:1}\n    - *v\n"
    assert parse_job_spec(text, offline=True).accelerators[0].name == "V100"


def test_recursive_alias_is_refused() -> None:
    error = refused("run: x\nenvs: &a\n  b: *a\n")
    assert "alias" in str(error)


def test_deep_nesting_names_the_line() -> None:
    error = refused("run: x\nenvs: " + "[" * 20_000 + "]" * 20_000 + "\n")
    assert "nested more than 64 levels deep" in str(error) and error.line == 2


def test_deep_block_nesting_is_refused() -> None:
    text = "run: x\nconfig:\n" + "".join("  " * (i + 1) + f"k{i}:\n" for i in range(100)) + "  " * 101 + "v: 1\n"
    assert "nested more than 64 levels deep" in str(refused(text))


def test_nul_byte_names_its_line() -> None:
    error = refused("run: x\nname: a\x00b\n")
    assert "NUL byte" in str(error) and error.line == 2


def test_huge_file_is_refused_before_parsing() -> None:
    error = refused("run: x\nenvs:\n  A: '" + "x" * 1_100_000 + "'\n")
    assert "at most 1,000,000" in str(error)


def test_impossible_timestamp_deadline_names_the_field() -> None:
    error = refused("run: x\nbroker:\n  deadline: 2030-13-45T00:00:00Z\n")
    assert (error.field, error.line) == ("broker.deadline", 3)
    assert "'2030-13-45T00:00:00Z'" in str(error)


def test_overflowing_duration_deadline_names_the_field() -> None:
    error = refused("run: x\nbroker:\n  deadline: 99999999999d\n")
    assert (error.field, error.line) == ("broker.deadline", 3)
    assert "at most 100 years" in str(error)


@pytest.mark.parametrize("key", ["work", "checkpoint: {grace"])
def test_overflowing_durations_elsewhere_name_the_field(key: str) -> None:
    text = f"run: x\nbroker:\n  {key}: 99999999999w" + ("}" if "{" in key else "") + "\n"
    error = refused(text)
    assert error.field is not None and error.field.startswith("broker.") and error.line == 3


def test_num_nodes_of_ten_to_the_23_names_the_field() -> None:
    error = refused("run: x\nnum_nodes: 100000000000000000000000\n")
    assert (error.field, error.line) == ("num_nodes", 2)
    assert "at most 1024 nodes" in str(error)


def test_priority_of_ten_to_the_23_names_the_field() -> None:
    error = refused("run: x\nbroker:\n  priority: 100000000000000000000000\n")
    assert (error.field, error.line) == ("broker.priority", 3)
    assert "at most 1,000,000" in str(error)


def test_name_over_200_characters_names_the_field() -> None:
    error = refused("name: " + "n" * 201 + "\nrun: x\n")
    assert (error.field, error.line) == ("name", 1)
    assert "at most 200 characters" in str(error)


def test_team_over_100_characters_names_the_field() -> None:
    error = refused("run: x\nbroker:\n  team: " + "t" * 101 + "\n")
    assert (error.field, error.line) == ("broker.team", 3)


def test_huge_value_is_quoted_short() -> None:
    error = refused("run: x\nbroker:\n  max_price: '" + "9" * 50_000 + "'\n")
    assert len(str(error)) < 600


def test_binary_file_from_disk_is_one_line(tmp_path: Path) -> None:
    path = tmp_path / "job.yaml"
    path.write_bytes(b"run: x\n\xff\xfe\x00garbage")
    done = subprocess.run([sys.executable, "-c", "import sys\nfrom broker.spec.job import SpecError, load_job_spec\n"
                           "try:\n    load_job_spec(sys.argv[1], offline=True)\nexcept SpecError as e:\n"
                           "    print(e); sys.exit(2)\n", str(path)],
                          capture_output=True, text=True, cwd=REPO, timeout=120)
    assert done.returncode == 2 and done.stderr == ""
    assert done.stdout.count("\n") == 1 and "not UTF-8" in done.stdout


def test_billion_laughs_in_a_child_process_stays_small(tmp_path: Path) -> None:
    code = ("import resource, sys\nfrom broker.spec.job import SpecError, load_job_spec\n"
            "try:\n    load_job_spec(sys.argv[1], offline=True)\nexcept SpecError as e:\n    print(e)\n"
            "print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)\n")

    def peak_kb(text: str) -> tuple[list[str], int]:
        path = tmp_path / "job.yaml"
        path.write_text(text)
        done = subprocess.run([sys.executable, "-c", code, str(path)], capture_output=True, text=True, cwd=REPO,
                              timeout=120)
        *said, peak = done.stdout.strip().splitlines()  # libraries may print lines of their own first
        return said, int(peak)

    # The same reading of a plain job file is the baseline: most of it is SkyPilot's import, whose
    # size depends on the machine; the alias bomb must add little to it (unbounded, it took GBs).
    _, plain = peak_kb("name: plain\nrun: echo hi\n")
    said, laughs_peak = peak_kb(laughs(12))
    assert any("aliases expand" in line for line in said), said
    assert laughs_peak - plain < 150_000, (plain, laughs_peak)


YAML_BITS = st.sampled_from([
    "run: x\n", "name: a\n", "num_nodes: ", "resources:\n", "  accelerators: ", "broker:\n", "  deadline: ",
    "  priority: ", "envs:\n", "  A: ", "&a ", "*a ", "[", "]", "{", "}", ", ", ": ", "- ", "---\n", "\x00",
    "H100:8", "{L4, A10G}", "0.5", "-1", "1e400", "99999999999999999999999", "2030-13-45", "null", "~", "'",
    '"', "\t", "\n", "  ", "<<: *a\n", "!!python/object:os.system ", "\ufeff", "\u2028", "ordered:\n",
    "any_of:\n", "    - ", "setup: y\n", "infra: gcp\n",
])


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(YAML_BITS, max_size=40).map("".join))
def test_fuzzed_job_files_raise_only_spec_errors(text: str) -> None:
    try:
        parse_job_file(text, source="fuzz.yaml", offline=True)
    except SpecError as exc:
        assert "\n" not in str(exc)
        assert len(str(exc)) < 1200


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=300))
def test_arbitrary_text_raises_only_spec_errors(text: str) -> None:
    try:
        parse_job_file(text, source="fuzz.yaml", offline=True)
    except SpecError as exc:
        assert "\n" not in str(exc)


_BASE = "resources:\n  accelerators: V100:1\nrun: echo hi\n"


@pytest.mark.parametrize(("text", "field", "words"), [
    ('name: "bad\\ud800"\n' + _BASE, "name", "lone surrogate"),
    ('broker:\n  team: "t\\ud800"\n' + _BASE, "broker.team", "lone surrogate"),
    ('envs:\n  A: "x\\udfff"\n' + _BASE, "envs.A", "lone surrogate"),
    ('broker:\n  checkpoint:\n    dir: "/a\\0b"\n' + _BASE, "broker.checkpoint.dir", "NUL"),
    ("broker:\n  checkpoint:\n    dir: /" + "a" * 100_000 + "\n" + _BASE, "broker.checkpoint.dir", "at most 4096"),
    ("resources:\n  accelerators: V100:1\n  memory: .nan\nrun: x\n", "resources.memory", "finite"),
    ("num_nodes: 0x" + "f" * 5000 + "\n" + _BASE, "num_nodes", "below 2**128"),
], ids=["surrogate-name", "surrogate-team", "surrogate-env", "nul-dir", "long-dir", "nan-memory", "huge-int"])
def test_values_no_field_may_hold_are_refused_naming_the_field(text: str, field: str, words: str) -> None:
    with pytest.raises(SpecError) as raised:
        parse_job_spec(text, offline=True)
    assert raised.value.field == field
    assert words in str(raised.value)


@pytest.mark.parametrize(("text", "field", "line"), [
    ("name: bad\ud800\n" + _BASE, "name", 1),
    ("broker:\n  team: t\ud800\n" + _BASE, "broker.team", 2),
    ("broker:\n  checkpoint:\n    dir: '/a\udfff'\n" + _BASE, "broker.checkpoint.dir", 3),
    ("envs:\n  A: x\udfff\n" + _BASE, "envs.A", 2),
    (_BASE + "file_mounts:\n  /a: [b, \"c\ud800\"]\n", "file_mounts./a.1", 5),
    ("envs:\n  A\ud800: x\n" + _BASE, "envs", 1),
    ("# a\ud800\n" + _BASE, None, 1),
    (_BASE + "envs: {\n  A: x\ud800", None, 5),
], ids=["name", "team", "checkpoint-dir", "env-value", "list-item", "env-name", "comment", "broken-yaml"])
def test_a_raw_lone_surrogate_in_the_text_is_refused_naming_the_field(text: str, field: str | None,
                                                                       line: int) -> None:
    """A lone surrogate in the text itself (what a JSON body's ``\\ud800`` escape gives), not written as
    a YAML escape: PyYAML's reader refused the character, naming neither field nor line."""
    error = refused(text)
    assert (error.field, error.line) == (field, line)
    assert "lone surrogate" in str(error)


@pytest.mark.parametrize("team", ["'[/bold]'", "'[red]x'", '"a\\e[31mred"', "'two words'", "'caf\u00e9'", "'a/b'"])
def test_a_team_that_tokens_could_not_name_is_refused_naming_the_field(team: str) -> None:
    error = refused("run: x\nbroker:\n  team: " + team + "\n")
    assert (error.field, error.line) == ("broker.team", 3)
    assert "letters, digits" in str(error) and "\x1b" not in str(error)
