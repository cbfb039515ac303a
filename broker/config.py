"""All settings in one model: ``~/.broker/config.yaml`` (or ``--config``), then ``BROKER_*`` variables.

Later features add their settings here, each with a ``BROKER_`` environment name.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import yaml
from pydantic import Field, ValidationError
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict


def default_home() -> Path:
    return Path(os.environ.get("BROKER_HOME") or Path.home() / ".broker")


class ConfigError(ValueError):
    pass


class _YamlFile(PydanticBaseSettingsSource):
    def __init__(self, settings_cls: type[BaseSettings], path: Path | None) -> None:
        super().__init__(settings_cls)
        self.path = path

    def get_field_value(self, field: Any, field_name: str) -> tuple[Any, str, bool]:
        return None, field_name, False

    def __call__(self) -> dict[str, Any]:
        if self.path is None or not self.path.exists():
            return {}
        try:
            data = yaml.safe_load(self.path.read_text()) or {}
        except yaml.YAMLError as exc:
            raise ConfigError(f"{self.path}: not valid YAML: {exc}") from exc
        if not isinstance(data, dict):
            raise ConfigError(f"{self.path}: expected a mapping of settings at the top level")
        return data


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="BROKER_", extra="forbid")

    home: Path = Field(default_factory=default_home, description="where state, logs and checkpoints live")
    db_url: str | None = Field(None, description="SQLAlchemy URL; default sqlite under home")
    backend: str = Field("local", description="provisioner: local or skypilot")
    market: Path | None = Field(None, description="market trace for the local backend")
    speed: float = Field(60.0, gt=0, description="local backend: market seconds per wall second")
    selection_policy: str | None = None
    placement_policy: str | None = None
    poll_seconds: float = Field(0.2, gt=0, description="engine step interval, wall seconds")
    server: str | None = Field(None, description="URL of a running `broker serve`")
    local_provision_seconds: float = Field(120.0, ge=0, description="local backend: market seconds to boot")
    # --- SkyPilot backend and cloud preemption notices (issue 4)
    skypilot_prefix: str = Field("broker-", pattern=r"^[a-z][-a-z0-9]*$",
                                 description="SkyPilot cluster names start with this; strays with it are torn down")
    skypilot_launch_timeout: float = Field(1800.0, gt=0, description="seconds a SkyPilot launch may take")
    skypilot_refresh_seconds: float = Field(10.0, gt=0, description="how often sky status / queue are re-read")
    skypilot_autostop_minutes: int | None = Field(60, ge=0, description="idle minutes before SkyPilot downs a cluster")
    api_host: str = Field("127.0.0.1", description="skypilot backend: where the notice API listens")
    api_port: int = Field(0, ge=0, le=65535, description="skypilot backend: notice API port (0: any free one)")
    public_url: str | None = Field(None, description="skypilot backend: the URL node agents report notices to")
    sqs_queue_url: str | None = Field(None, description="SQS queue receiving EventBridge EC2 spot events")
    sqs_region: str | None = Field(None, description="region of the SQS queue (default: from its URL)")
    sqs_endpoint_url: str | None = Field(None, description="SQS endpoint override (VPC endpoint, tests)")

    @property
    def database_url(self) -> str:
        if self.db_url:
            return self.db_url
        return f"sqlite:///{self.home / 'broker.db'}"

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        path = _CONFIG_PATH or default_home() / "config.yaml"
        return init_settings, env_settings, _YamlFile(settings_cls, path)


_CONFIG_PATH: Path | None = None


def load_settings(config: Path | None = None, **overrides: Any) -> Settings:
    """Read settings; ``overrides`` (from command-line flags) win over file and environment."""
    global _CONFIG_PATH
    if config is not None and not config.exists():
        raise ConfigError(f"--config {config}: no such file")
    _CONFIG_PATH = config
    try:
        return Settings(**{k: v for k, v in overrides.items() if v is not None})
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in err['loc'])}: {err['msg']}" for err in exc.errors()
        )
        raise ConfigError(f"invalid settings: {problems}") from exc
    finally:
        _CONFIG_PATH = None
