"""A dashboard checked strictly against Grafana's own generated dashboard types (grafana-foundation-sdk).

The SDK's decoder skips keys it does not know and copies values without looking at them, so on its
own it accepts a misspelt or mistyped field. Here every key of the file must survive a decode and
re-encode, and every decoded value must have the type the SDK's model declares for that field.
"""

from __future__ import annotations

import enum
import json
import types
import typing
from typing import Any

from grafana_foundation_sdk.cog import runtime
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.cog.plugins import register_default_plugins
from grafana_foundation_sdk.models.dashboard import Dashboard

register_default_plugins()
_DECODE_ERRORS = (TypeError, KeyError, AttributeError, ValueError)


def dashboard_errors(data: Any) -> list[str]:
    """One line per field of `data` that Grafana's dashboard schema does not accept; empty if it all fits."""
    errors: list[str] = []
    _check(data, Dashboard, "dashboard", errors)
    if not errors:
        known = runtime.Runtime().panelcfg_variants
        for i, panel in enumerate(data.get("panels") or []):
            if panel.get("type") not in known and panel.get("type") != "row":
                errors.append(f"dashboard.panels[{i}].type: {panel.get('type')!r} is a panel type with no schema")
    return errors


def _check(value: Any, hint: Any, path: str, errors: list[str]) -> None:
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if hint is Any or hint is object:
        if hasattr(value, "to_json"):
            _check_model(value, path, errors)
    elif origin in (typing.Union, types.UnionType):
        for arm in args:
            trial: list[str] = []
            _check(value, arm, path, trial)
            if not trial:
                return
        nearest = min((_errors_for(value, arm, path) for arm in args if arm is not type(None)), key=len)
        errors.extend(nearest or [f"{path}: {value!r:.80} is none of {hint}"])
    elif hint is type(None) or origin is typing.Literal:
        if value not in (args if origin is typing.Literal else (None,)):
            errors.append(f"{path}: {value!r:.80} is not one of {list(args) or [None]}")
    elif origin is list:
        if not isinstance(value, list):
            errors.append(f"{path}: {value!r:.80} is not a list")
            return
        for i, item in enumerate(value):
            _check(item, args[0], f"{path}[{i}]", errors)
    elif origin is dict:
        if not isinstance(value, dict):
            errors.append(f"{path}: {value!r:.80} is not an object")
            return
        for key, item in value.items():
            _check(item, args[1], f"{path}.{key}", errors)
    elif isinstance(hint, type) and issubclass(hint, enum.Enum):
        allowed = [member.value for member in hint]
        if not isinstance(value, hint) and (isinstance(value, bool) or value not in allowed):
            errors.append(f"{path}: {value!r:.80} is not one of {allowed}")
    elif hint in (bool, int, float, str):
        kinds: tuple[type, ...] = (int, float) if hint is float else (hint,)
        if not isinstance(value, kinds) or (hint is not bool and isinstance(value, bool)):
            errors.append(f"{path}: {value!r:.80} is not of type {hint.__name__}")
    elif isinstance(hint, type):
        _check_object(value, hint, path, errors)
    else:
        errors.append(f"{path}: no rule for the type {hint}")


def _check_object(value: Any, hint: type, path: str, errors: list[str]) -> None:
    if isinstance(value, dict) and hasattr(hint, "from_json"):
        # A field the SDK copies as raw JSON although it declares a model for it (a panel's links).
        try:
            model = hint.from_json(value)
        except _DECODE_ERRORS as exc:
            errors.append(f"{path}: does not decode as {hint.__name__}: {exc!r:.80}")
            return
        _dropped(value, json.loads(json.dumps(model, cls=JSONEncoder)), path, errors)
        value = model
    if isinstance(value, runtime.UnknownDataquery):
        errors.append(f"{path}: a query for a data source with no schema ({value.data.get('datasource')!r:.60})")
    elif not isinstance(value, hint):
        errors.append(f"{path}: {value!r:.80} is not of type {hint.__name__}")
    else:
        _check_model(value, path, errors)


def _check_model(model: Any, path: str, errors: list[str]) -> None:
    for name, hint in typing.get_type_hints(type(model)).items():
        _check(getattr(model, name, None), hint, f"{path}.{name}", errors)


def _errors_for(value: Any, hint: Any, path: str) -> list[str]:
    found: list[str] = []
    _check(value, hint, path, found)
    return found


def _dropped(source: Any, encoded: Any, path: str, errors: list[str]) -> None:
    """Name every key of `source` that the model's round trip lost or changed: a field Grafana does not know."""
    if isinstance(source, dict) and isinstance(encoded, dict):
        for key, item in source.items():
            if key not in encoded:
                errors.append(f"{path}.{key}: not a field of the schema")
            else:
                _dropped(item, encoded[key], f"{path}.{key}", errors)
    elif isinstance(source, list) and isinstance(encoded, list) and len(source) == len(encoded):
        for i, (item, back) in enumerate(zip(source, encoded, strict=True)):
            _dropped(item, back, f"{path}[{i}]", errors)
    elif source != encoded:
        errors.append(f"{path}: {source!r:.80} does not survive a round trip (became {encoded!r:.80})")
