"""The job file: SkyPilot's task YAML judged by SkyPilot, the broker section by pydantic, errors placed by line.

Most tests validate ``offline`` (the built-in catalog answers catalog questions) so that they give
the same result with or without network. The SkyPilot-catalog path runs in a child process whose
SkyPilot home is a temporary directory and whose catalog server is a local HTTP server.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import yaml

from broker.spec.job import (
    AcceleratorChoice,
    CloudScope,
    JobSpec,
    SpecError,
    job_spec_from_data,
    load_job_spec,
    parse_duration,
    parse_job_spec,
    sky_task_config,
)
from providers import catalog

SPECS = Path(__file__).resolve().parents[1] / "specs"
REPO = Path(__file__).resolve().parents[3]
NOW = datetime(2030, 6, 1, 12, 0, tzinfo=UTC)


@pytest.fixture(scope="module", autouse=True)
def sky_imported() -> None:
    """SkyPilot takes seconds to import: pay once per module rather than inside the first test."""
    import sky  # noqa: F401


def parse(text: str, **kwargs: Any) -> JobSpec:
    kwargs.setdefault("now", NOW)
    kwargs.setdefault("offline", True)
    return parse_job_spec(text, source="job.yaml", **kwargs)


def refused(text: str, **kwargs: Any) -> SpecError:
    with pytest.raises(SpecError) as caught:
        parse(text, **kwargs)
    return caught.value


# --- valid files ------------------------------------------------------------------------------


def test_full_file_gives_every_broker_setting() -> None:
    spec = load_job_spec(SPECS / "full.yaml", offline=True)
    assert spec.name == "llm-finetune"
    assert spec.num_nodes == 2
    assert spec.accelerators == (AcceleratorChoice("A100-80GB", 8), AcceleratorChoice("H100", 8))
    assert (spec.accelerator, spec.gpus_per_node) == ("A100-80GB", 8)
    assert spec.use_spot is True
    assert spec.envs == {"EPOCHS": "3"}
    assert spec.file_mounts == {"/data": "s3://example-datasets/tokens"}
    assert spec.resolved_workdir() == SPECS.resolve()
    b = spec.broker
    assert (b.priority, b.work, b.max_price, b.team) == (500, timedelta(hours=10), 45.5, "nlp")
    assert b.clouds == (CloudScope("aws"), CloudScope("gcp", "us-central1"))
    assert b.deadline == timedelta(days=2)
    assert b.deadline_at(NOW) == NOW + timedelta(days=2)
    assert (b.checkpoint.dir, b.checkpoint.signal, b.checkpoint.grace) == (
        "s3://example-checkpoints/llm", "SIGUSR1", timedelta(seconds=90))


def test_plain_skypilot_file_is_valid_with_broker_defaults() -> None:
    spec = load_job_spec(SPECS / "plain_skypilot.yaml", offline=True)
    assert spec.accelerators == (AcceleratorChoice("V100", 4),)
    assert spec.setup is not None and "torchvision" in spec.setup
    assert spec.broker.priority == 500
    assert spec.broker.deadline is None and spec.broker.max_price is None and spec.broker.clouds == ()
    assert spec.broker.checkpoint.signal == "SIGUSR1"
    assert spec.broker.checkpoint.grace == timedelta(seconds=120)
    assert "broker" not in spec.to_data()


@pytest.mark.parametrize(("accelerators", "expected"), [
    ("V100:2", [("V100", 2)]),
    ("a10g", [("A10G", 1)]),
    ("{V100: 2}", [("V100", 2)]),
    ("{L4: 4, A10G: 4}", [("L4", 4), ("A10G", 4)]),
    ("[A100:8, H100:8]", [("A100", 8), ("H100", 8)]),
])
def test_accelerators_in_every_form_list_alternatives_in_order(accelerators: str,
                                                               expected: list[tuple[str, int]]) -> None:
    spec = parse(f"run: x\nresources:\n  accelerators: {accelerators}\n")
    assert [(a.name, a.count) for a in spec.accelerators] == expected


def test_any_of_gives_several_choices_in_file_order() -> None:
    spec = parse("run: x\nresources:\n  use_spot: true\n  any_of:\n"
                 "    - accelerators: H100:8\n    - accelerators: a100:8\n      infra: gcp\n"
                 "    - accelerators: L4:8\n")
    assert spec.accelerators == (AcceleratorChoice("H100", 8), AcceleratorChoice("A100", 8),
                                 AcceleratorChoice("L4", 8))
    assert spec.use_spot is True


def test_ordered_alternatives_share_the_base_accelerators() -> None:
    spec = parse("run: x\nresources:\n  accelerators: A100:8\n  ordered:\n    - infra: gcp\n    - infra: aws\n")
    assert spec.accelerators == (AcceleratorChoice("A100", 8),)


def test_priority_classes_and_integers() -> None:
    for given, expected in [("inference", 1000), ("training", 500), ("Batch", 100), ("750", 750), ("0", 0)]:
        assert parse(f"run: x\nbroker:\n  priority: {given}\n").broker.priority == expected


def test_deadline_as_timestamp_is_utc_aware() -> None:
    spec = parse("run: x\nbroker:\n  deadline: 2030-06-02T08:00:00+02:00\n")
    assert spec.broker.deadline == datetime(2030, 6, 2, 6, 0, tzinfo=UTC)
    assert spec.broker.deadline_at(NOW) == spec.broker.deadline
    naive = parse("run: x\nbroker:\n  deadline: '2030-06-02 08:00'\n")
    assert naive.broker.deadline == datetime(2030, 6, 2, 8, 0, tzinfo=UTC)


def test_signal_names_are_normalised() -> None:
    for given in ("usr2", "SIGUSR2", "sigusr2", "12"):
        spec = parse(f"run: x\nbroker:\n  checkpoint:\n    signal: {given}\n")
        assert spec.broker.checkpoint.signal == "SIGUSR2"


def test_parse_duration_units() -> None:
    assert parse_duration("90s") == timedelta(seconds=90)
    assert parse_duration("1.5h") == timedelta(minutes=90)
    assert parse_duration("2d") == timedelta(days=2)
    assert parse_duration(45) == timedelta(seconds=45)
    with pytest.raises(SpecError, match="expected a duration") as caught:
        parse_duration("soon", "broker.work")
    assert caught.value.field == "broker.work"


# --- round trip and the SkyPilot part -----------------------------------------------------------


@pytest.mark.parametrize("name", ["full.yaml", "plain_skypilot.yaml"])
def test_to_data_round_trips_through_yaml_and_json(name: str) -> None:
    spec = load_job_spec(SPECS / name, offline=True)
    assert parse_job_spec(yaml.safe_dump(spec.to_data()), source=spec.source or "", offline=True) == spec
    stored = json.loads(json.dumps(spec.to_data()))
    assert job_spec_from_data(stored, source=spec.source, offline=True) == spec


def test_timestamp_deadline_round_trips_and_a_stored_job_keeps_a_passed_deadline() -> None:
    spec = parse("run: x\nbroker:\n  deadline: 2030-06-02T00:00:00Z\n")
    data = json.loads(json.dumps(spec.to_data()))
    assert parse_job_spec(yaml.safe_dump(data), source="job.yaml", now=NOW, offline=True) == spec
    # Stored jobs are re-read after their deadline passes; only a new submission is refused.
    assert job_spec_from_data(data, source="job.yaml", offline=True).broker.deadline == spec.broker.deadline
    with pytest.raises(SpecError, match="in the past"):
        parse_job_spec(yaml.safe_dump(data), now=NOW + timedelta(days=2), offline=True)


def test_sky_task_config_is_the_skypilot_part_only_and_skypilot_accepts_it() -> None:
    import sky

    spec = load_job_spec(SPECS / "full.yaml", offline=True)
    config = sky_task_config(spec)
    assert "broker" not in config
    assert config["resources"]["any_of"][1] == {"accelerators": "h100:8", "infra": "aws"}
    task = sky.Task.from_yaml_config(config)
    assert task.num_nodes == 2 and task.name == "llm-finetune"
    config["run"] = "changed"
    assert spec.task_config["run"] != "changed"


# --- bad files: message, field, line ------------------------------------------------------------

BAD_FILES: list[tuple[str, str, str | None, int | None, list[str]]] = [
    ("negative accelerator count", "run: x\nresources:\n  accelerators: H100:-1\n",
     "resources.accelerators", 3, ["Accelerator count must be a positive number", "'H100': -1"]),
    ("unknown top-level key", "run: x\nnum_node: 2\n", "num_node", 2,
     ["SkyPilot", "Instead of 'num_node', did you mean 'num_nodes'?"]),
    ("unknown resources key", "run: x\nresources:\n  accelerators: V100:1\n  gpu_count: 4\n",
     "resources.gpu_count", 4, ["Found unsupported field 'gpu_count'"]),
    ("unknown key in an any_of item", "run: x\nresources:\n  any_of:\n    - accelerators: A100:8\n"
     "    - accelerators: H100:8\n      bogus: 2\n", "resources.any_of[1].bogus", 6, ["unsupported field 'bogus'"]),
    ("unknown broker key", "run: x\nbroker:\n  prority: batch\n", "broker.prority", 3,
     ["unknown key 'prority'", "did you mean 'priority'?", "max_price"]),
    ("unknown checkpoint key", "run: x\nbroker:\n  checkpoint:\n    dir: /ckpt\n    sig: USR1\n",
     "broker.checkpoint.sig", 5, ["unknown key 'sig'", "dir, signal, grace"]),
    ("yaml: unclosed flow list", "run: x\nresources:\n  accelerators: [V100:1\nbroker: {}\n", None, 4,
     ["not valid YAML", "expected ',' or ']'", "on line 3"]),
    ("yaml: tab indent", "run: x\nresources:\n\taccelerators: V100\n", None, 3, ["not valid YAML", "'\\t'"]),
    ("yaml: duplicate key", "run: a\nsetup: b\nrun: c\n", "run", 3, ["duplicate key 'run'", "line 1"]),
    ("deadline in the past", "run: x\nbroker:\n  deadline: 2020-01-01T00:00:00Z\n", "broker.deadline", 3,
     ["2020-01-01T00:00:00+00:00 is in the past", "2030-06-01T12:00:00+00:00"]),
    ("deadline unreadable", "run: x\nbroker:\n  deadline: next week\n", "broker.deadline", 3,
     ["ISO timestamp", "'next week'"]),
    ("bad priority", "run: x\nbroker:\n  team: ml\n  priority: urgent\n", "broker.priority", 4,
     ["inference (1000), training (500), batch (100)", "'urgent'"]),
    ("negative priority", "run: x\nbroker:\n  priority: -5\n", "broker.priority", 3, ["whole number >= 0"]),
    ("bad signal", "run: x\nbroker:\n  checkpoint:\n    signal: SIGFOO\n", "broker.checkpoint.signal", 4,
     ["like SIGUSR1", "'SIGFOO'"]),
    ("uncatchable signal", "run: x\nbroker:\n  checkpoint:\n    signal: SIGKILL\n", "broker.checkpoint.signal", 4,
     ["can catch", "'SIGKILL'"]),
    ("negative max_price", "run: x\nbroker:\n  max_price: -3\n", "broker.max_price", 3,
     ["USD per hour for the whole gang", "> 0", "-3"]),
    ("max_price not a number", "run: x\nbroker:\n  max_price: cheap\n", "broker.max_price", 3, ["'cheap'"]),
    ("max_price true", "run: x\nbroker:\n  max_price: true\n", "broker.max_price", 3, ["True"]),
    ("unknown cloud", "run: x\nbroker:\n  clouds:\n    - aws\n    - oracle/us-phoenix-1\n", "broker.clouds[1]", 5,
     ["unknown cloud 'oracle'", "aws, gcp, azure, local"]),
    ("checkpoint dir scheme", "run: x\nbroker:\n  checkpoint:\n    dir: http://host/ckpt\n",
     "broker.checkpoint.dir", 4, ["s3://, gs:// or az://", "http://"]),
    ("grace not a duration", "run: x\nbroker:\n  checkpoint:\n    grace: soon\n", "broker.checkpoint.grace", 4,
     ["duration like 90s"]),
    ("broker not a mapping", "run: x\nbroker: 5\n", "broker", 2, ["expected a mapping", "priority"]),
    ("num_nodes 0", "run: x\nnum_nodes: 0\n", "num_nodes", 2, ["num_nodes should be a positive int. Got: 0"]),
    ("use_spot not a boolean", "run: x\nresources:\n  use_spot: maybe\n", "resources.use_spot", 3,
     ["'maybe' is not of type 'boolean'"]),
    ("env without a value", "run: x\nenvs:\n  TOKEN:\n", "envs.TOKEN", 3, ["Environment variable 'TOKEN' is None"]),
    ("infra with region", "run: x\nresources:\n  infra: aws\n  region: us-east-1\n", "resources.infra", 3,
     ["Cannot specify both `infra` and"]),
    ("fraction over one GPU", "run: x\nresources:\n  accelerators: V100:1.5\n", "resources.accelerators", 3,
     ["fraction below 1", "'1.5'"]),
    ("top level is a list", "- run: x\n", None, 1, ["expected a mapping"]),
    ("empty file", "", None, None, ["expected a mapping", "empty file"]),
]


@pytest.mark.parametrize(("text", "field", "line", "fragments"), [case[1:] for case in BAD_FILES],
                         ids=[case[0] for case in BAD_FILES])
def test_bad_file_names_field_line_and_expectation(text: str, field: str | None, line: int | None,
                                                   fragments: list[str], broker_home: Path) -> None:
    error = refused(text)
    assert (error.field, error.line) == (field, line)
    message = str(error)
    assert message.startswith(f"job.yaml{':' + str(line) if line else ''}: {field + ': ' if field else ''}")
    for fragment in fragments:
        assert fragment in message
    assert not broker_home.exists()  # validation writes nothing


def test_old_spot_recovery_key_is_refused_with_skypilots_hint() -> None:
    with pytest.raises(SpecError) as caught:
        load_job_spec(SPECS / "spot_recovery.yaml", offline=True)
    error = caught.value
    assert (error.field, error.line) == ("resources.spot_recovery", 5)
    assert str(error) == (f"{SPECS / 'spot_recovery.yaml'}:5: resources.spot_recovery: SkyPilot: Invalid resources "
                          "YAML: Instead of 'spot_recovery', did you mean 'job_recovery'?")


def test_missing_file() -> None:
    with pytest.raises(SpecError, match="no such file"):
        load_job_spec(SPECS / "absent.yaml")


# --- names looked up in the built-in catalog (offline) ------------------------------------------


def test_unknown_accelerator_offline_lists_the_known_ones() -> None:
    error = refused("run: x\nresources:\n  accelerators: H2O0:8\n")
    assert (error.field, error.line) == ("resources.accelerators", 3)
    message = str(error)
    assert "unknown accelerator 'H2O0' on any of aws, gcp, azure (did you mean 'H200'?)" in message
    assert all(name in message for name in catalog.ACCELERATORS)
    assert "built-in catalog: offline validation" in message


def test_accelerator_count_must_be_offered() -> None:
    error = refused("run: x\nresources:\n  infra: gcp\n  accelerators: {A100: 3}\n")
    assert (error.field, error.line) == ("resources.accelerators.A100", 4)
    counts = sorted({t.gpus for t in catalog.instance_types(cloud="gcp", accelerator="A100")})
    assert f"A100:3 is not offered on gcp: a node has {', '.join(map(str, counts))} A100" in str(error)


def test_gpus_attached_to_a_general_purpose_machine_come_in_any_count() -> None:
    assert parse("run: x\nresources:\n  infra: gcp\n  accelerators: {V100: 4}\n").accelerators[0].count == 4


def test_a_count_one_alternative_lacks_rules_out_that_choice_only() -> None:
    spec = parse("run: x\nresources:\n  accelerators: {A100:1, T4:1}\n  any_of:\n    - cloud: aws\n    - cloud: gcp\n")
    assert [a.name for a in spec.accelerators] == ["A100", "T4"]


def test_a_choice_no_cloud_sells_is_dropped_with_a_warning_naming_it() -> None:
    # L40 is sold on Kubernetes and neoclouds, not on AWS, GCP or Azure: SkyPilot takes the set.
    spec = parse("run: x\nresources:\n  accelerators: {L4, L40, A10G}\n")
    assert spec.accelerators == (AcceleratorChoice("L4", 1), AcceleratorChoice("A10G", 1))
    [warning] = spec.warnings
    assert warning.startswith("job.yaml:3: resources.accelerators.L40: 'L40' dropped from the accelerator choices: "
                              "not sold on any of aws, gcp, azure (did you mean 'L40S'?)")
    assert warning.endswith("; the job keeps L4:1, A10G:1")
    spec = parse("run: x\nresources:\n  accelerators: [B100:8, H100:8]\n")
    assert spec.accelerators == (AcceleratorChoice("H100", 8),)
    assert [w.split(": ")[1] for w in spec.warnings] == ["resources.accelerators[0]"]
    # A whole any_of alternative whose only choice no cloud sells goes; the pin it named goes with it.
    spec = parse("run: x\nresources:\n  any_of:\n    - accelerators: B100:1\n      infra: aws\n"
                 "    - accelerators: L4:1\n      infra: gcp\n")
    assert spec.accelerators == (AcceleratorChoice("L4", 1),)
    assert [p.cloud for p in spec.resource_places] == ["gcp"]
    assert "'B100' dropped" in spec.warnings[0]
    assert parse("run: x\nresources:\n  accelerators: {L4, A10G}\n").warnings == ()


@pytest.mark.parametrize("text", [
    "run: x\nresources:\n  accelerators: {L40, B100}\n",
    "run: x\nresources:\n  accelerators: L40:1\n",
    "run: x\nresources:\n  any_of:\n    - accelerators: L40:1\n    - accelerators: B100:8\n",
    "run: x\nresources:\n  infra: gcp\n  accelerators: {L40: 1, A100: 3}\n",
])
def test_with_no_choice_left_the_first_unsold_one_is_the_refusal(text: str) -> None:
    error = refused(text)
    assert "unknown accelerator 'L40'" in str(error)
    assert str(error.field).startswith("resources.") and error.line in (3, 4)


def test_a_dropped_choice_with_a_hostile_name_is_one_escaped_clipped_line() -> None:
    name = "\\x1b[31mX" + "Y" * 900  # YAML keys stop at 1,024 characters
    spec = parse(f'run: x\nresources:\n  accelerators: {{L4: 1, "{name}": 1}}\n')
    [warning] = spec.warnings
    assert "\x1b" not in warning and "\n" not in warning and len(warning) <= 520
    assert spec.accelerators == (AcceleratorChoice("L4", 1),)


def test_a_fraction_per_node_in_a_gang_is_accepted_as_skypilot_does() -> None:
    # SkyPilot's job-queue examples: half a T4 on each of two nodes.
    spec = parse("run: x\nnum_nodes: 2\nresources:\n  accelerators: T4:0.5\n")
    assert (spec.num_nodes, spec.accelerators) == (2, (AcceleratorChoice("T4", 1, 0.5),))
    assert refused("run: x\nnum_nodes: 2\nresources:\n  accelerators: T4:1.5\n").field == "resources.accelerators"


def test_broker_clouds_narrow_where_an_accelerator_must_exist() -> None:
    assert parse("run: x\nresources:\n  accelerators: A10:1\n").accelerators == (AcceleratorChoice("A10", 1),)
    error = refused("run: x\nresources:\n  accelerators: A10:1\nbroker:\n  clouds: [aws, gcp]\n")
    assert "unknown accelerator 'A10' on any of aws, gcp" in str(error)


def test_instance_type_checked_against_its_cloud() -> None:
    assert parse("run: x\nresources:\n  infra: aws\n  instance_type: p4d.24xlarge\n").instance_type == "p4d.24xlarge"
    error = refused("run: x\nresources:\n  cloud: azure\n  instance_type: p4d.24xlarge\n")
    assert (error.field, error.line) == ("resources.instance_type", 4)
    assert "unknown instance type 'p4d.24xlarge' for azure" in str(error)


def test_an_any_of_item_is_blamed_on_its_own_line() -> None:
    spec = parse("run: x\nresources:\n  any_of:\n    - accelerators: A100:8\n    - accelerators: B900:8\n")
    assert spec.warnings[0].startswith("job.yaml:5: resources.any_of[1].accelerators: 'B900' dropped")
    error = refused("run: x\nresources:\n  any_of:\n    - accelerators: A100:3\n    - accelerators: B900:8\n"
                    "broker:\n  clouds: [gcp]\n")
    assert (error.field, error.line) == ("resources.any_of[1].accelerators", 5)


def test_clouds_outside_the_catalog_are_left_to_skypilot() -> None:
    spec = parse("run: x\nresources:\n  infra: lambda\n  accelerators: GH200:1\n")
    assert spec.accelerators == (AcceleratorChoice("GH200", 1),)


# --- SkyPilot's catalog, served from a local server to a child process -------------------------

# A real (retired) AWS type the built-in catalog lacks: only SkyPilot's catalog can make `K80` valid on AWS.
EXTRA_AWS_ROW = ("p2.xlarge", "K80", 1, 4, 61, 12288, 0.9, 0.27)


def _aws_catalog_csv() -> str:
    rows = [(t.name, t.accelerator, t.gpus, t.vcpus, t.memory_gb, int(t.gpu_memory_gb * 1024), 10.0, 3.0)
            for t in catalog.instance_types(cloud="aws")] + [EXTRA_AWS_ROW]
    lines = ["InstanceType,AcceleratorName,AcceleratorCount,vCPUs,MemoryGiB,GpuInfo,Price,SpotPrice,Region,"
             "AvailabilityZone"]
    for name, acc, gpus, vcpus, mem, gpu_mib, price, spot in rows:
        info = (f"{{'Gpus': [{{'Name': '{acc}', 'Manufacturer': 'NVIDIA', 'Count': {gpus}, "
                f"'MemoryInfo': {{'SizeInMiB': {gpu_mib}}}}}], 'TotalGpuMemoryInMiB': {gpu_mib * gpus}}}")
        for zone in ("use1-az1", "use1-az2"):
            lines.append(f'{name},{acc},{gpus},{vcpus},{mem},"{info}",{price},{spot},us-east-1,{zone}')
    return "\n".join(lines) + "\n"


@pytest.fixture(scope="module")
def catalog_server() -> Iterator[str]:
    """AWS: a catalog in SkyPilot's CSV format. Azure: 404. GCP: accepts, then never answers."""
    body = _aws_catalog_csv().encode()
    release = threading.Event()

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            if self.path.endswith("/aws/vms.csv"):
                self.send_response(200)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)
            elif "/gcp/" in self.path:
                release.wait(60)
            else:
                self.send_error(404)

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    release.set()
    server.shutdown()
    server.server_close()


CHILD = """
import json, sys, time
from sky.skylet import constants
constants.HOSTED_CATALOG_DIR_URL = constants.HOSTED_CATALOG_DIR_URL_S3_MIRROR = sys.argv[1]
from broker.spec.job import SpecError, parse_job_spec
results = []
for text, timeout in json.loads(sys.argv[2]):
    started = time.monotonic()
    try:
        spec = parse_job_spec(text, source="job.yaml", catalog_timeout=timeout)
        result = {"accelerators": [[a.name, a.count] for a in spec.accelerators]}
    except SpecError as exc:
        result = {"error": str(exc), "field": exc.field, "line": exc.line}
    result["seconds"] = time.monotonic() - started
    results.append(result)
print(json.dumps(results))
"""

# Generous where the server answers (the first lookup also imports pandas on a busy machine),
# short where it never will.
ANSWERING, SILENT = 60.0, 3.0
CATALOG_CASES = [
    ("run: x\nresources:\n  infra: aws\n  accelerators: K80:1\n", ANSWERING),
    ("run: x\nresources:\n  infra: aws\n  instance_type: p9.xlarge\n", ANSWERING),
    ("run: x\nresources:\n  infra: aws/us-east-1\n  accelerators: H100:8\n", ANSWERING),
    ("run: x\nresources:\n  infra: aws/mars-north-1\n  accelerators: H100:8\n", ANSWERING),
    ("run: x\nresources:\n  infra: azure\n  accelerators: L40S:1\n", ANSWERING),
    ("run: x\nresources:\n  infra: gcp\n  accelerators: L40S:1\n", SILENT),
    # Asked again right after: the built-in catalog answers at once, however long the caller would wait.
    ("run: x\nresources:\n  infra: gcp\n  accelerators: L40S:1\n", ANSWERING),
    # An instance type only SkyPilot's catalog knows, with what it carries and with what it does not.
    ("run: x\nresources:\n  infra: aws\n  accelerators: K80:1\n  instance_type: p2.xlarge\n", ANSWERING),
    ("run: x\nresources:\n  infra: aws\n  accelerators: K80:2\n  instance_type: p2.xlarge\n", ANSWERING),
]


@pytest.fixture(scope="module")
def catalog_results(catalog_server: str, tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    home = tmp_path_factory.mktemp("sky-home")
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("AWS_", "GOOGLE_", "AZURE_", "SKYPILOT_", "BROKER_"))}
    env.update(HOME=str(home), SKY_RUNTIME_DIR=str(home), TMPDIR=str(home), PYTHONPATH=str(REPO),
               AWS_EC2_METADATA_DISABLED="true", NO_PROXY="127.0.0.1,localhost", no_proxy="127.0.0.1,localhost")
    done = subprocess.run([sys.executable, "-c", CHILD, catalog_server, json.dumps(CATALOG_CASES)],
                          env=env, cwd=home, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    results: list[dict[str, Any]] = json.loads(done.stdout.strip().splitlines()[-1])
    assert (home / ".sky" / "catalogs").is_dir()  # SkyPilot's cache went to the child's home, not ours
    return results


@pytest.mark.slow
def test_skypilot_catalog_knows_what_the_builtin_one_does_not(catalog_results: list[dict[str, Any]]) -> None:
    assert catalog_results[0]["accelerators"] == [["K80", 1]]
    assert not catalog.instance_types(cloud="aws", accelerator="K80")


@pytest.mark.slow
def test_skypilot_catalog_refuses_unknown_instance_type(catalog_results: list[dict[str, Any]]) -> None:
    result = catalog_results[1]
    assert (result["field"], result["line"]) == ("resources.instance_type", 4)
    assert result["error"].endswith("unknown instance type 'p9.xlarge' for aws")


@pytest.mark.slow
def test_skypilot_catalog_judges_regions(catalog_results: list[dict[str, Any]]) -> None:
    assert catalog_results[2]["accelerators"] == [["H100", 8]]
    refused_region = catalog_results[3]
    assert (refused_region["field"], refused_region["line"]) == ("resources.infra", 3)
    assert "SkyPilot: Invalid region 'mars-north-1'" in refused_region["error"]


@pytest.mark.slow
def test_catalog_fetch_failure_falls_back_to_builtin(catalog_results: list[dict[str, Any]]) -> None:
    result = catalog_results[4]
    assert "unknown accelerator 'L40S' on azure" in result["error"]
    assert "SkyPilot's catalog for azure could not be fetched (HTTPError)" in result["error"]


@pytest.mark.slow
def test_catalog_that_never_answers_does_not_hang_validation(catalog_results: list[dict[str, Any]]) -> None:
    result = catalog_results[5]
    assert f"no answer from SkyPilot's catalog for gcp within {SILENT:g}s" in result["error"]
    assert result["seconds"] < ANSWERING / 2  # bounded by the short timeout, not by the server (which never answers)


@pytest.mark.slow
def test_an_unreachable_catalog_is_not_waited_for_again(catalog_results: list[dict[str, Any]]) -> None:
    result = catalog_results[6]
    assert "SkyPilot's catalog for gcp could not be fetched recently" in result["error"]
    assert result["seconds"] < ANSWERING / 2  # a wait on the silent server again would take the whole 60 s


def test_topology_requirement_is_read() -> None:
    spec = parse("run: x\nresources: {accelerators: V100:4}\nbroker:\n  topology: {level: node, required: true}\n")
    assert (spec.broker.topology.level, spec.broker.topology.required) == ("node", True)
    assert parse("run: x\n").broker.topology.level == "any"


def test_unknown_topology_level_names_field_and_choices() -> None:
    error = refused("run: x\nbroker:\n  topology:\n    level: rack\n")
    assert error.field == "broker.topology.level" and error.line == 4
    assert "node" in str(error) and "placement_group" in str(error)


@pytest.mark.slow
def test_skypilot_catalog_refuses_an_instance_type_without_the_accelerators(
        catalog_results: list[dict[str, Any]]) -> None:
    assert catalog_results[7]["accelerators"] == [["K80", 1]]
    refused_pair = catalog_results[8]
    assert (refused_pair["field"], refused_pair["line"]) == ("resources.instance_type", 5)
    assert refused_pair["error"].endswith("instance type 'p2.xlarge' carries K80:1 per node, not the accelerators "
                                          "asked for (K80:2): name the matching instance type or leave it out")


def test_an_empty_envs_is_no_variables() -> None:
    assert parse("run: x\nenvs:\n").envs == {}
