"""No import cycles between the modules of ``broker/``, ``policies/`` and ``providers/``, and no
import of ``broker`` from ``policies`` or ``providers``.

The graph counts every import a module makes: at its top level, inside a function (a lazy import
only hides a cycle), under ``if TYPE_CHECKING:`` (the types bind the modules as much as the code
does), and by string: ``importlib.import_module("a.b")``, a module's name in a table of them
(a tuple, list, set or dict literal), and ``"a.b:name"`` references. ``from package import name``
points at ``package.name`` when that is a module, else at ``package``.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("broker", "policies", "providers")


def _modules() -> dict[str, Path]:
    found = {}
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            parts = path.relative_to(ROOT).with_suffix("").parts
            name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
            found[name] = path
    return found


def _imports(body: list[ast.stmt]) -> Iterator[ast.Import | ast.ImportFrom]:
    for node in body:
        for child in ast.walk(node):
            if isinstance(child, (ast.Import, ast.ImportFrom)):
                yield child


IMPORT_CALLS = {"import_module", "__import__"}


MODULE_REFERENCE = re.compile(r"[A-Za-z_][\w.]*:[A-Za-z_]\w*")  # "package.module:name", as entry points write it


def _named_by_string(tree: ast.Module, modules: dict[str, Path]) -> set[str]:
    """Modules named by a dotted string: imported by name, listed in a table, or referenced as ``module:name``."""
    named: set[str] = set()
    for node in ast.walk(tree):
        strings: list[ast.expr] = []
        if isinstance(node, ast.Call):
            func = node.func
            called = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""
            if called in IMPORT_CALLS and node.args:
                strings.append(node.args[0])
        elif isinstance(node, (ast.Tuple, ast.List, ast.Set)):
            strings.extend(node.elts)
        elif isinstance(node, ast.Dict):
            strings.extend([*(k for k in node.keys if k is not None), *node.values])
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and MODULE_REFERENCE.fullmatch(node.value):
            module = node.value.partition(":")[0]
            if module in modules:
                named.add(module)
        # A dotted name only: "broker" alone is as likely a policy's name as the package.
        named |= {e.value for e in strings
                  if isinstance(e, ast.Constant) and isinstance(e.value, str) and "." in e.value and e.value in modules}
    return named


def _graph() -> dict[str, set[str]]:
    modules = _modules()
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        tree = ast.parse(path.read_text())
        edges = {t for t in _named_by_string(tree, modules) if t != name}
        for node in _imports(tree.body):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            else:
                base = node.module or ""
                if node.level:
                    anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join([*anchor, base] if base else anchor)
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names]
            edges |= {t for t in targets if t in modules and t != name}
        graph[name] = edges
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Every strongly connected component with more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(graph[node]):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                component.append(top)
                if top == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_the_graph_sees_imports() -> None:
    graph = _graph()
    assert "broker.engine.machine" in graph["broker.engine.packing"]
    assert "broker.engine.clusters" in graph["broker.engine.step"]  # from broker.engine import clusters
    assert "policies.gang" in graph["policies.placement"]
    assert "providers.aws" in graph["providers.notices"]  # inside reader_for
    hidden = ast.parse("if TYPE_CHECKING:\n    from broker.runtime import Runtime\nelse:\n    import broker.clock\n")
    assert [n.module if isinstance(n, ast.ImportFrom) else n.names[0].name for n in _imports(hidden.body)] == [
        "broker.runtime", "broker.clock"]  # both branches of `if TYPE_CHECKING:` count
    assert "broker.cli.jobs" in graph["broker.cli.commands"]  # a table of module names
    modules = _modules()
    named = _named_by_string(ast.parse('importlib.import_module("policies.gang")\nx = "broker.clock:WallClock"\n'
                                       'log = getLogger("broker.engine")'), modules)
    assert named == {"policies.gang", "broker.clock"}  # a logger's name is not an import
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


# Cycles that changes under way remove (the runtime and its SkyPilot runtime, the service's runner
# and its tasks, the status summary and its ORM reader); named, so that no new one hides behind them.
def test_no_import_cycles() -> None:
    cycles = _cycles(_graph())
    assert cycles == [], "import cycles: " + "; ".join(" <-> ".join(c) for c in cycles)


def test_policies_and_providers_import_nothing_from_broker() -> None:
    graph = _graph()
    wrong = {name: sorted(t for t in targets if t.startswith("broker"))
             for name, targets in graph.items() if not name.startswith("broker")}
    assert {name: targets for name, targets in wrong.items() if targets} == {}
