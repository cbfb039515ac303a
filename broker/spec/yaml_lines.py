"""YAML loading that remembers, for every key and list item, the line it starts on."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from datetime import date, datetime
from itertools import chain
from typing import Any

import yaml

from broker.spec.errors import SpecError

Path = tuple[str | int, ...]


def format_path(path: Path) -> str:
    """``("resources", "any_of", 1, "accelerators")`` -> ``resources.any_of[1].accelerators``."""
    out = ""
    for part in path:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


_JSON_PATH_PART = re.compile(r"\.([^.\[\]]+)|\[(\d+)\]")


def parse_json_path(text: str) -> Path:
    """``$.resources.any_of[0]`` (as jsonschema prints it) -> ``("resources", "any_of", 0)``."""
    return tuple(int(m.group(2)) if m.group(2) is not None else m.group(1)
                 for m in _JSON_PATH_PART.finditer(text.removeprefix("$")))


@dataclass(frozen=True)
class LoadedYaml:
    data: Any
    lines: dict[Path, int] = field(default_factory=dict)
    first_line: int = 1  # where the document starts in the file

    def line_of(self, path: Path) -> int | None:
        """The line of ``path``, or of its nearest ancestor that is in the file."""
        for end in range(len(path), 0, -1):
            line = self.lines.get(path[:end])
            if line is not None:
                return line
        return None

    def paths_ending_with(self, key: str) -> list[Path]:
        """Every key path whose last key is ``key``, in file order."""
        found = [p for p in self.lines if p and p[-1] == key]
        return sorted(found, key=lambda p: self.lines[p])


# Limits that keep one job file from taking the service down (billion laughs, deep nesting, huge files).
MAX_FILE_BYTES = 1_000_000
MAX_DEPTH = 64
MAX_STAGES = 100  # task documents of one pipeline (each is validated like a job file)
MAX_NODES = 100_000  # keys, items and scalars after alias expansion
MAX_INT_BITS = 128  # far past any field's range (fields bound their own); a 5,000-digit number is an attack


class _Loader(yaml.SafeLoader):
    """SafeLoader without implicit timestamps: a date stays the text written, so a wrong one
    (``2030-13-45``) is judged by the field that reads it instead of failing the whole file."""


_Loader.yaml_implicit_resolvers = {
    first: [(tag, regexp) for tag, regexp in resolvers if tag != "tag:yaml.org,2002:timestamp"]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}


def load_yaml_documents(text: str, source: str) -> list[LoadedYaml]:
    """Every document of a (multi-document) YAML file, each with its keys' lines in the file.

    Aliases are expanded only after their expanded size has been counted, so a file of nested
    anchors is refused at the alias that would blow up instead of being expanded.
    """
    _check_text(text, source)
    surrogate = lone_surrogate(text)
    if surrogate is not None:
        raise SpecError(SURROGATE_PROBLEM, surrogate[0], surrogate[1], source)
    try:
        loader = _Loader(text)  # reads the first characters already: may raise a ReaderError
    except yaml.YAMLError as exc:
        raise SpecError(f"not valid YAML: {' '.join(str(exc).split())}", line=1, source=source) from None
    documents: list[LoadedYaml] = []
    try:
        while loader.check_node():
            node = loader.get_node()
            if node is None:
                continue
            if len(documents) > MAX_STAGES:  # a header and MAX_STAGES tasks at most
                raise SpecError(f"more than {MAX_STAGES + 1} YAML documents: a pipeline has at most {MAX_STAGES} "
                                "stages", line=node.start_mark.line + 1, source=source)
            _check_size(node, source)
            lines: dict[Path, int] = {}
            _record_lines(node, (), lines, source)
            data = json_safe(loader.construct_document(node))
            loaded = LoadedYaml(data, lines, node.start_mark.line + 1)
            _check_values(data, (), loaded, source)
            documents.append(loaded)
    except SpecError:
        raise
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        problem = exc.problem or "cannot be read"
        if exc.context:
            started = exc.context_mark
            on_line = f" on line {started.line + 1}" if started and mark and started.line != mark.line else ""
            problem = f"{problem} ({exc.context}{on_line})"
        raise SpecError(f"not valid YAML: {problem}", line=mark.line + 1 if mark else None,
                        source=source) from None
    except yaml.YAMLError as exc:
        raise SpecError(f"not valid YAML: {' '.join(str(exc).split())}", line=loader.get_mark().line + 1,
                        source=source) from None
    except RecursionError:
        raise SpecError(f"nested more than {MAX_DEPTH} levels deep", line=loader.get_mark().line + 1,
                        source=source) from None
    except (ValueError, OverflowError) as exc:  # a value PyYAML's constructors cannot build
        raise SpecError(f"not valid YAML: {exc}", source=source) from None
    finally:
        loader.dispose()
    return documents or [LoadedYaml(None, {}, 1)]


def _check_values(value: Any, path: Path, loaded: LoadedYaml, source: str) -> None:
    """Refuse, naming the field, what no field may hold: lone surrogates and NULs in text (they
    cannot be stored, encoded or passed to a process), NaN and infinities, integers past 64 bits."""
    field = ".".join(str(part) for part in path) or "(document)"
    problem = None
    if isinstance(value, str):
        if "\x00" in value:
            problem = "contains a NUL character"
        else:
            try:
                value.encode("utf-8")
            except UnicodeEncodeError:
                problem = "contains a lone surrogate (not valid Unicode text)"
    elif isinstance(value, float) and not math.isfinite(value):
        problem = f"expected a finite number, got {value!r}"
    elif isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > MAX_INT_BITS:
        problem = f"expected a number below 2**{MAX_INT_BITS}, got one of {value.bit_length()} bits"
    elif isinstance(value, dict):
        for key, item in value.items():
            _check_values(key, path, loaded, source)
            _check_values(item, (*path, key), loaded, source)
    elif isinstance(value, list):
        for index, item in enumerate(value):
            _check_values(item, (*path, index), loaded, source)
    if problem is not None:
        raise SpecError(problem, field, loaded.line_of(path), source)


_LONE_SURROGATE = re.compile(r"[\ud800-\udfff]")
SURROGATE_PROBLEM = "contains a lone surrogate (not valid Unicode text)"


def lone_surrogate(text: str) -> tuple[str | None, int] | None:
    """Where the first raw lone surrogate in ``text`` is (an API body's ``\\ud800`` escape gives one):
    the field whose key or value holds it (None when no field does, or the rest cannot be read) and
    its line; None when there is none. PyYAML's reader refuses the character itself, naming no
    field, so the text is read again with each surrogate replaced by a character it does not hold."""
    found = _LONE_SURROGATE.search(text)
    if found is None:
        return None
    line = text.count("\n", 0, found.start()) + 1
    held = set(text)
    stand_in = next((chr(c) for c in chain(range(0xE000, 0xF900), range(0xF0000, 0xFFFFE)) if chr(c) not in held), None)
    try:
        documents = load_yaml_documents(_LONE_SURROGATE.sub(stand_in, text), "") if stand_in else []
    except SpecError:
        documents = []  # something else is wrong too: the surrogate, on its line, is refused first
    for loaded in documents:
        path = _holding(loaded.data, (), stand_in or "")
        if path is not None:
            return ".".join(str(p) for p in path) or None, loaded.line_of(path) or line
    return None, line


def _holding(value: Any, path: Path, char: str) -> Path | None:
    """The path of the first string (key or value) holding ``char``; a key's is its mapping's."""
    if isinstance(value, str):
        return path if char in value else None
    items: list[tuple[Any, Any]] = list(value.items()) if isinstance(value, dict) else []
    if isinstance(value, list):
        items = list(enumerate(value))
    for key, item in items:
        if isinstance(value, dict) and isinstance(key, str) and char in key:
            return path
        found = _holding(item, (*path, key), char)
        if found is not None:
            return found
    return None


def _check_text(text: str, source: str) -> None:
    if len(text) > MAX_FILE_BYTES:
        raise SpecError(f"the job file is {len(text):,} characters; at most {MAX_FILE_BYTES:,} are accepted "
                        "(put large scripts in files under workdir)", source=source)
    nul = text.find("\x00")
    if nul >= 0:
        raise SpecError("contains a NUL byte (a binary file?); a job file is YAML text",
                        line=text.count("\n", 0, nul) + 1, source=source)


def _check_size(root: yaml.Node, source: str) -> None:
    """Refuse a document whose aliases expand past ``MAX_NODES`` or nest past ``MAX_DEPTH``."""
    sizes: dict[int, int] = {}
    visiting: set[int] = set()

    def size(node: yaml.Node, depth: int, path: Path) -> int:
        key = id(node)
        if key in sizes:
            return sizes[key]
        line = node.start_mark.line + 1
        where = format_path(path) or None
        if depth > MAX_DEPTH:
            raise SpecError(f"nested more than {MAX_DEPTH} levels deep", field=where, line=line, source=source)
        if key in visiting:
            raise SpecError("an alias refers to the collection it is inside (a recursive alias)", field=where,
                            line=line, source=source)
        visiting.add(key)
        total = 1
        children: list[tuple[yaml.Node, Path]] = []
        if isinstance(node, yaml.MappingNode):
            for key_node, value_node in node.value:
                children += [(key_node, path), (value_node, (*path, str(key_node.value)))]
        elif isinstance(node, yaml.SequenceNode):
            children = [(item, (*path, index)) for index, item in enumerate(node.value)]
        for child, child_path in children:
            total += size(child, depth + 1, child_path)
            if total > MAX_NODES:
                raise SpecError(f"YAML aliases expand to more than {MAX_NODES:,} values (nested anchors, "
                                "a \"billion laughs\" file?); write the values out or use fewer aliases",
                                field=format_path(child_path) or None, line=line, source=source)
        visiting.discard(key)
        sizes[key] = total
        return total

    size(root, 0, ())


def _record_lines(node: yaml.Node, path: Path, lines: dict[Path, int], source: str) -> None:
    if isinstance(node, yaml.MappingNode):
        seen: dict[str, int] = {}
        for key_node, value_node in node.value:
            key = str(key_node.value)
            line = key_node.start_mark.line + 1
            if key in seen and key != "<<":
                raise SpecError(f"duplicate key {key!r} (first given on line {seen[key]}); give each key once",
                                field=format_path((*path, key)), line=line, source=source)
            seen[key] = line
            lines[(*path, key)] = line
            _record_lines(value_node, (*path, key), lines, source)
    elif isinstance(node, yaml.SequenceNode):
        for index, item in enumerate(node.value):
            lines[(*path, index)] = item.start_mark.line + 1
            _record_lines(item, (*path, index), lines, source)


def json_safe(value: Any) -> Any:
    """The same data with string keys and ISO-format dates, so it survives a trip through JSON."""
    if isinstance(value, dict):
        return {str(k): json_safe(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [json_safe(v) for v in value]
    if isinstance(value, datetime | date):
        return value.isoformat()
    return value
