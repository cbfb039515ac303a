"""The SkyPilot part of a job file, judged by SkyPilot's schema (``check_schema``: the broker's copy of
it, no SkyPilot import) and by SkyPilot itself (``validate_task``: ``sky.Task.from_yaml_config``).

Its refusals come back as ``SpecError`` carrying SkyPilot's own message and hint, placed on the
offending key: SkyPilot's messages name fields in one of a few ways (a json path, a quoted key,
a word like "num_nodes"), and ``locate`` finds that key among the file's line-numbered paths.
"""

from __future__ import annotations

import copy
import re
from typing import Any

from broker.spec.errors import SpecError
from broker.spec.yaml_lines import LoadedYaml, Path, format_path, parse_json_path

_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
_JSON_PATH = re.compile(r"Check problematic field\(s\): (\$\S*)")
_QUOTED = re.compile(r"'([^']+)'|`([^`]+)`|\"([^\"]+)\"")
# Words in SkyPilot's messages that name a key without quoting it, most specific first.
_KEYWORDS: tuple[tuple[str, str], ...] = (
    ("infra", "infra"), ("num_nodes", "num_nodes"), ("environment variable", "envs"), ("envs", "envs"),
    ("secret", "secrets"), ("instance type", "instance_type"), ("accelerator", "accelerators"),
    ("cpus", "cpus"), ("memory", "memory"), ("disk_size", "disk_size"), ("disk size", "disk_size"),
    ("disk_tier", "disk_tier"), ("image_id", "image_id"), ("image", "image_id"), ("ports", "ports"),
    ("labels", "labels"), ("job_recovery", "job_recovery"), ("file_mount", "file_mounts"),
    ("storage", "file_mounts"), ("workdir", "workdir"), ("volume", "volumes"), ("zone", "zone"),
    ("region", "region"), ("cloud", "cloud"), ("use_spot", "use_spot"), ("autostop", "autostop"),
)


def validate_task(config: dict[str, Any], doc: LoadedYaml, source: str) -> None:
    """Raise ``SpecError`` if SkyPilot refuses ``config`` (the job file without ``broker:``).

    ``from_yaml_config`` checks the schema and the values it can judge without a cloud catalog;
    catalog lookups happen in ``catalog_check``.
    """
    import sky  # slow (seconds): only when a job file is actually read
    from sky import sky_logging

    try:
        with sky_logging.silent():
            sky.Task.from_yaml_config(copy.deepcopy(config))
    except (ValueError, TypeError, KeyError, AssertionError) as exc:
        raise _refusal(_ANSI.sub("", str(exc)).strip() or type(exc).__name__, doc, source) from None


def check_schema(config: dict[str, Any], doc: LoadedYaml, source: str) -> None:
    """Raise ``SpecError`` if SkyPilot's schema refuses ``config``: SkyPilot's words, on the same key as
    ``validate_task`` would put them, in milliseconds (``broker.spec.sky_schema``)."""
    from broker.spec.sky_schema import SkyRefusal, check

    try:
        check(config)
    except SkyRefusal as exc:
        raise _refusal(str(exc), doc, source) from None


def _refusal(message: str, doc: LoadedYaml, source: str) -> SpecError:
    path = locate(message, doc)
    return SpecError(f"SkyPilot: {message}", field=format_path(path) if path else None,
                     line=doc.line_of(path) if path else None, source=source)


def locate(message: str, doc: LoadedYaml) -> Path | None:
    """The key a SkyPilot error message is about, as a path in the file (None if it cannot tell)."""
    in_resources = "resources YAML" in message
    match = _JSON_PATH.search(message)
    if match:
        relative = parse_json_path(match.group(1))
        bases: list[Path] = [("resources",)] if in_resources else [()]
        if in_resources:
            bases += [p for p in doc.lines if len(p) == 3 and p[:2] in (("resources", "any_of"),
                                                                         ("resources", "ordered"))]
        for base in bases:
            if (*base, *relative) in doc.lines:
                return (*base, *relative)
    quoted = [next(g for g in m.groups() if g is not None) for m in _QUOTED.finditer(message)]
    for token in quoted:
        found = _find_key(doc, token, in_resources, quoted)
        if found:
            return found
    lowered = message.lower()
    for word, key in _KEYWORDS:
        if word in lowered:
            found = _find_key(doc, key, in_resources, quoted)
            if found:
                return found
    return ("resources",) if in_resources and ("resources",) in doc.lines else None


def _find_key(doc: LoadedYaml, key: str, in_resources: bool, hints: list[str]) -> Path | None:
    paths = doc.paths_ending_with(key)
    preferred = [p for p in paths if p[0] == "resources"] if in_resources else []
    paths = preferred or sorted(paths, key=len)
    if not paths:
        return None
    # Several (say one accelerators per any_of item): prefer the one whose value the message quotes.
    for path in paths:
        value = _value_at(doc.data, path)
        if any(hint in str(value) for hint in hints if hint != key):
            return path
    return paths[0]


def _value_at(data: Any, path: Path) -> Any:
    for part in path:
        if isinstance(data, dict):
            data = data.get(str(part))
        elif isinstance(data, list) and isinstance(part, int) and part < len(data):
            data = data[part]
        else:
            return None
    return data
