"""One error base: every exception class of broker/, policies/ and providers/ derives from its
package's base, and user errors mean exit 2 in the CLI and a 4xx from the API."""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from broker.api.app import create_app
from broker.cli import main
from broker.clock import WallClock
from broker.errors import BrokerError, UserError, is_user_error
from broker.store import open_store
from policies.errors import PolicyError, PolicyInputError
from providers.base import ProviderError, ProviderInputError

ROOT = Path(__file__).resolve().parents[2]
BASES = {"broker": BrokerError, "policies": PolicyError, "providers": ProviderError}


def _exception_classes() -> list[tuple[str, str]]:
    """(module, class) for every class defined at a module's top level whose bases name an exception."""
    found = []
    for package in BASES:
        for path in sorted((ROOT / package).rglob("*.py")):
            parts = path.relative_to(ROOT).with_suffix("").parts
            module = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
            for node in ast.parse(path.read_text()).body:
                if isinstance(node, ast.ClassDef) and any(
                        (isinstance(b, ast.Name) and (b.id.endswith(("Error", "Exception")) or b.id in (
                            "LookupError", "KeyError", "ValueError", "RuntimeError")))
                        or (isinstance(b, ast.Attribute) and b.attr.endswith("Error")) for b in node.bases):
                    found.append((module, node.name))
    return found


def test_the_walk_finds_the_exception_classes() -> None:
    found = set(_exception_classes())
    assert {("broker.spec.errors", "SpecError"), ("providers.trace", "TraceError"),
            ("policies.registry", "UnknownPolicy"), ("broker.store.db", "Fenced")} <= found
    assert len(found) >= 30


@pytest.mark.parametrize(("module", "name"), _exception_classes())
def test_every_exception_class_derives_from_its_packages_base(module: str, name: str) -> None:
    error = getattr(importlib.import_module(module), name)
    assert issubclass(error, BASES[module.split(".")[0]]), f"{module}.{name}: {error.__mro__}"


def test_user_errors_are_the_ones_the_cli_and_the_api_answer_as_such() -> None:
    from broker.config.file import ConfigError
    from broker.engine.machine import UnknownJob
    from broker.spec.errors import SpecError
    from broker.store.db import Fenced, StoreError
    from policies.registry import UnknownPolicy
    from providers.trace import TraceError

    for error in (ConfigError("x"), UnknownJob("x"), SpecError("x"), StoreError("x"), TraceError("x"),
                  UnknownPolicy("x")):
        assert is_user_error(error), type(error)
    assert isinstance(TraceError("x"), ProviderInputError) and isinstance(UnknownPolicy("x"), PolicyInputError)
    assert not is_user_error(Fenced("x")) and not is_user_error(ValueError("x"))
    # The builtin bases stay, so `except ValueError` around a job file's parse still catches it.
    assert issubclass(SpecError, ValueError) and issubclass(UnknownJob, LookupError)


def test_a_user_error_is_one_line_and_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                            broker_home: Path) -> None:
    trace = tmp_path / "market.csv"
    trace.write_text("not,a,trace\n1,2,3\n")
    job = tmp_path / "job.yaml"
    job.write_text("resources:\n  accelerators: V100:1\nrun: python train.py\n"
                   "broker:\n  work: 1 gpu-hour\n  deadline: 2h\n")
    with pytest.raises(SystemExit) as done:
        main(["simulate", str(job), "--market", str(trace)])
    assert done.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "Traceback" not in err and len(err.strip().splitlines()) == 1


def test_a_user_error_no_route_caught_is_a_4xx_with_its_message(tmp_path: Path) -> None:
    from broker.engine.machine import UnknownJob
    from broker.store.db import StoreError

    app = create_app(open_store(f"sqlite:///{tmp_path / 'store.db'}"), WallClock())
    raised: dict[str, Exception] = {"job": UnknownJob("no job 'j-9'"), "store": StoreError("cannot open the store"),
                                    "user": UserError("field: bad"), "trace": ProviderInputError("row 2: bad")}

    @app.get("/raise/{what}")
    def raise_it(what: str) -> None:
        raise raised[what]

    client = TestClient(app)
    answers = {what: client.get(f"/raise/{what}") for what in raised}
    assert {what: a.status_code for what, a in answers.items()} == {"job": 404, "store": 503, "user": 422,
                                                                     "trace": 422}
    assert answers["job"].json() == {"detail": "no job 'j-9'"}


def test_the_node_agent_imports_nothing_from_policies() -> None:
    """The agent's wheel carries broker/ and providers/ only (broker/backends/agent_wheel.py)."""
    import subprocess
    import sys

    probe = ("import sys, broker.agent.__main__, broker.agent.node, broker.errors;"
             "print(sorted(m for m in sys.modules if m.split('.')[0] == 'policies'))")
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, check=True)
    assert done.stdout.strip() == "[]"
