"""The settings file: its limits and its one-line errors, in one place light enough for the CLI's start-up."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from broker.errors import UserError


class ConfigError(UserError, ValueError):
    pass


# A settings file is a few KB; anything near this is not one.
MAX_CONFIG_BYTES = 1024 * 1024


def read_settings_file(path: Path) -> dict[str, Any]:
    """The mapping in the settings file at ``path`` (which exists), or ConfigError in one line."""
    import yaml

    try:
        with path.open("rb") as handle:
            raw = handle.read(MAX_CONFIG_BYTES + 1)
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read the settings file: {exc.strerror or exc}") from None
    if len(raw) > MAX_CONFIG_BYTES:
        raise ConfigError(f"{path}: larger than {MAX_CONFIG_BYTES} bytes; not a settings file")
    try:
        text = raw.decode("utf-8")
        if "\x00" in text:
            raise UnicodeDecodeError("utf-8", raw, text.index("\x00"), text.index("\x00") + 1, "NUL byte")
    except UnicodeDecodeError:
        raise ConfigError(f"{path}: not text (a binary file?); expected YAML settings") from None
    try:
        data = yaml.safe_load(text) or {}
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: not valid YAML: {' '.join(str(exc).split())}") from None
    except RecursionError:
        raise ConfigError(f"{path}: nested too deeply to be settings") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a mapping of settings at the top level, got {type(data).__name__}")
    return data


DATABASE_SCHEMES = ("sqlite", "postgresql")


def check_home(value: Path) -> Path:
    """``home`` must be a directory, or not exist yet (ValueError otherwise)."""
    if "\x00" in str(value):
        raise ValueError("contains a NUL byte")
    if value.exists() and not value.is_dir():
        raise ValueError(f"{value} is not a directory (state, logs and checkpoints go there)")
    return value


def check_db_url(value: str) -> str:
    """``db_url`` must be a SQLAlchemy URL of a database the broker supports (ValueError otherwise)."""
    if "\x00" in value:
        raise ValueError("contains a NUL byte")
    from broker.status.readonly import sqlite_path

    if sqlite_path(value) is not None:  # a plain sqlite:///PATH: valid, and `broker status` needs no SQLAlchemy
        return value
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError

    try:
        url = make_url(value)
    except (ArgumentError, ValueError):
        raise ValueError("not a database URL; expected sqlite:///PATH or postgresql://HOST/DB") from None
    if url.get_backend_name() not in DATABASE_SCHEMES:
        raise ValueError(f"unsupported database {url.get_backend_name()!r}; "
                         "expected sqlite:///PATH or postgresql://HOST/DB")
    return value


def checked(field: str, value: str) -> str:
    """An environment setting read without the settings model, judged as the model would judge it."""
    try:
        if field == "db_url":
            return check_db_url(value)
        return str(check_home(Path(value)))
    except ValueError as exc:
        raise ConfigError(f"invalid settings: {field}: Value error, {exc}") from None
