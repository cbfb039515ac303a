"""YAML loading that remembers, for every key and list item, the line it starts on."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from datetime import date, datetime
from typing import Any

import yaml

from broker.specfile.errors import SpecError

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


def load_yaml(text: str, source: str) -> LoadedYaml:
    loader = yaml.SafeLoader(text)
    try:
        node = loader.get_single_node()
        data = loader.construct_document(node) if node is not None else None
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
        raise SpecError(f"not valid YAML: {exc}", source=source) from None
    finally:
        loader.dispose()
    lines: dict[Path, int] = {}
    if node is not None:
        _record_lines(node, (), lines, source)
    return LoadedYaml(json_safe(data), lines)


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
