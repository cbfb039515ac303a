"""All settings in one model: ``~/.broker/config.yaml`` (or ``--config``), then ``BROKER_*`` variables.

Later features add their settings here, each with a ``BROKER_`` environment name.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import yaml
from pydantic import Field, SecretStr, ValidationError
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict

from broker.service.schedule_config import PolicySchedule


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

    # --- serve: the long-running service, its API, leader election and schedules (broker serve) ---
    serve_host: str = Field("127.0.0.1", description="address `broker serve` listens on")
    serve_port: int = Field(8470, ge=0, lt=65536, description="port `broker serve` listens on (0: any free)")
    public_url: str | None = Field(None, description="URL agents reach the service at; default http://host:port")
    token: SecretStr | None = Field(None, description="API token the CLI sends to --server")
    leader_check_seconds: float = Field(3.0, gt=0, description="how often leadership is tried or re-checked")
    reconcile_seconds: float = Field(30.0, gt=0, description="interval of the reconcile pass")
    price_poll_seconds: dict[str, float] = Field(
        default_factory=lambda: {"aws": 300.0, "gcp": 300.0, "azure": 300.0},
        description="cloud -> seconds between price polls")
    price_poller: str = Field("broker.service.hooks:poll_prices", description="module:function polling one cloud")
    report_check_seconds: float = Field(60.0, gt=0, description="how often due report schedules are looked for")
    report_runner: str = Field("broker.service.hooks:run_due_reports", description="module:function sending reports")
    capacity_gpus: int | None = Field(None, ge=1, description="GPUs running jobs may hold; shares are fractions of it")
    offline_catalog: bool = Field(False, description="validate submitted job files against the built-in catalog only")
    policy_schedules: list[PolicySchedule] = Field(default_factory=list, description="time-based policy changes")

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
