"""SkyPilot's task YAML schema, checked by the broker without importing SkyPilot.

Importing SkyPilot takes seconds, and most files it refuses break its JSON schema (an unknown key,
a value of the wrong type). ``check`` judges the SkyPilot part of a job file by that schema, as
``sky.Task.from_yaml_config`` does before anything else, with SkyPilot's own wording: the task's
keys, then its ``resources`` (every ``any_of``/``ordered`` item too). The schemas are SkyPilot's
own, copied into ``broker/data/skypilot_schema.json`` by ``scripts/skypilot_schema.py``; a test
compares the copy with the installed SkyPilot's. A file that passes is still judged by SkyPilot
itself where SkyPilot runs it (``broker.spec.skypilot.validate_task``).
"""

from __future__ import annotations

import difflib
import functools
import json
from pathlib import Path
from typing import Any

from broker.errors import UserError

SCHEMA_FILE = Path(__file__).resolve().parents[1] / "data" / "skypilot_schema.json"


class SkyRefusal(UserError, ValueError):
    """What SkyPilot would raise for the file, in its words (``broker.spec.skypilot`` places it on a key)."""


@functools.cache
def schemas() -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads(SCHEMA_FILE.read_text())
    return loaded


def check(task: dict[str, Any]) -> None:
    """Raise ``SkyRefusal`` with SkyPilot's message if its schema refuses ``task`` (the file less ``broker:``)."""
    config = dict(task)
    # As SkyPilot reads them: env and secret names and values as text (a YAML 123 is "123").
    envs = config.get("envs")
    if isinstance(envs, dict):
        config["envs"] = {str(k): None if v is None else str(v) for k, v in envs.items()}
    secrets = config.get("secrets")
    if isinstance(secrets, dict):
        config["secrets"] = {str(k): None if v is None else str(v) for k, v in secrets.items()}
    elif isinstance(secrets, list):
        config["secrets"] = [str(item) for item in secrets]
    _validate(config, schemas()["task"], "Invalid task YAML: ")
    for name, value in (config.get("envs") or {}).items():
        if value is None:
            raise SkyRefusal(f"Environment variable {name!r} is None. Please set a value for it in task YAML or with "
                             f"--env flag. To set it to be empty, use an empty string ({name}: \"\" in task YAML or "
                             f"--env {name}=\"\" in CLI).")
    resources = config.get("resources") or {}
    if "hooks" in resources:
        raise SkyRefusal("Lifecycle hooks live under top-level `config.hooks:`, not `resources.hooks:`. Move the list "
                         "to `config.hooks` at the top level of the task YAML.")
    resources = dict(resources)
    _aliases(resources)
    for key in ("any_of", "ordered"):
        items = resources.get(key)
        if isinstance(items, list):
            resources[key] = [_aliased(item) for item in items]
    _validate(resources, schemas()["resources"], "Invalid resources YAML: ")


def _aliased(item: Any) -> Any:
    if not isinstance(item, dict):
        return item
    item = dict(item)
    _aliases(item)
    return item


def _aliases(config: dict[str, Any]) -> None:
    for alias, canonical in schemas()["resource_aliases"].items():
        if alias in config:
            if canonical in config:
                raise SkyRefusal(f"Cannot specify both {alias} and {canonical} in config.")
            config[canonical] = config.pop(alias)


@functools.cache
def _validator_class() -> Any:
    import jsonschema

    def case_insensitive_enum(validator: Any, enums: list[str], instance: Any, schema: Any) -> Any:
        if instance.lower() not in [enum.lower() for enum in enums]:
            yield jsonschema.ValidationError(f"{instance!r} is not one of {enums!r}")

    def case_sensitive_enum(validator: Any, enums: list[str], instance: Any, schema: Any) -> Any:
        if instance not in enums:
            yield jsonschema.ValidationError(f"{instance!r} is not one of {enums!r}")

    return jsonschema.validators.extend(jsonschema.Draft7Validator, validators={
        "case_insensitive_enum": case_insensitive_enum, "case_sensitive_enum": case_sensitive_enum})


def _validate(obj: dict[str, Any], schema: dict[str, Any], prefix: str) -> None:
    """``sky.utils.common_utils.validate_schema``: the same validator, the same messages."""
    import jsonschema

    obj = {k: v for k, v in obj.items() if v is not None}
    try:
        _validator_class()(schema).validate(obj)
    except jsonschema.ValidationError as e:
        if e.validator == "additionalProperties":
            if tuple(e.schema_path) == ("properties", "envs", "additionalProperties"):
                raise SkyRefusal(prefix + "The `envs` field contains invalid keys:\n" + e.message) from None
            known = set(e.schema.get("properties", {}).keys()) if isinstance(e.schema, dict) else set()
            parts = []
            for field in e.instance if isinstance(e.instance, dict) else ():
                if field not in known:
                    similar = difflib.get_close_matches(field, known, 1)
                    parts.append(f"Instead of {field!r}, did you mean {similar[0]!r}?" if similar
                                 else f"Found unsupported field {field!r}.")
            raise SkyRefusal(prefix + " ".join(parts)) from None
        best = jsonschema.exceptions.best_match([e])
        message = best.message.replace("type 'object'", "type 'dict'")
        raise SkyRefusal(f"{prefix}{message}. Check problematic field(s): {best.json_path}") from None
