"""All settings in one model: ``~/.broker/config.yaml`` (or ``--config``), then ``BROKER_*`` variables.

Later features add their settings here, each with a ``BROKER_`` environment name.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import AliasChoices, Field, SecretStr, ValidationError, ValidationInfo, field_validator
from pydantic_settings import BaseSettings, NoDecode, PydanticBaseSettingsSource, SettingsConfigDict

from broker.config.file import ConfigError, check_db_url, check_home, read_settings_file
from broker.config.teams import TeamSettings, check_teams, teams_from_json
from broker.reports.settings import BudgetSettings, ReportSchedule
from broker.service.schedule_config import PolicySchedule
from providers.base import PUBLIC_CLOUDS


def default_home() -> Path:
    return Path(os.environ.get("BROKER_HOME") or Path.home() / ".broker")




class _YamlFile(PydanticBaseSettingsSource):
    def __init__(self, settings_cls: type[BaseSettings], path: Path | None) -> None:
        super().__init__(settings_cls)
        self.path = path

    def get_field_value(self, field: Any, field_name: str) -> tuple[Any, str, bool]:
        return None, field_name, False

    def __call__(self) -> dict[str, Any]:
        if self.path is None or not self.path.exists():
            return {}
        return read_settings_file(self.path)


class Settings(BaseSettings):
    # NaN and infinities are refused for every number (an infinite speed or poll interval overflowed later)
    model_config = SettingsConfigDict(env_prefix="BROKER_", extra="forbid", allow_inf_nan=False)

    home: Path = Field(default_factory=default_home, description="where state, logs and checkpoints live")
    db_url: str | None = Field(None, description="SQLAlchemy URL; default sqlite under home")
    backend: str = Field("local", description="provisioner: local or skypilot")
    market: Path | None = Field(None, description="market trace for the local backend")
    speed: float = Field(60.0, gt=0, le=1e6, description="local backend: market seconds per wall second")
    selection_policy: str | None = None
    placement_policy: str | None = None
    preemption_policy: str | None = None
    max_gpus: int | None = Field(None, ge=1, description="GPUs the broker may hold across all its clusters")
    start_retries: int = Field(2, ge=0, le=100, description="times a job's failed start (its setup exits non-zero, "
                               "the node refuses the command) is tried again before the job fails with the error")
    poll_seconds: float = Field(0.2, gt=0, le=86400.0, description="engine step interval, wall seconds")
    server: str | None = Field(None, description="URL of a running `broker serve`")
    local_provision_seconds: float = Field(120.0, ge=0, le=30 * 86400.0,
                                           description="local backend: market seconds to boot")
    eager_policy: str | None = Field(None, description="eager allocation: eager, or off (the default)")
    eager_lead_seconds: float = Field(120.0, ge=0, le=86400.0, description="market seconds before a running job's "
                                      "predicted finish from which the next queued job is readied")
    pool_idle_seconds: float = Field(0.0, ge=0, le=86400.0, description="market seconds a cluster nobody holds is "
                                     "kept for the queue before it is torn down (0: at once)")
    queue_max_gpus: dict[str, int] = Field(default_factory=dict, description="queue (inference, training, batch "
                                           "or custom) -> GPUs the clusters launched for its jobs may hold")
    gpu_idle_below: float = Field(0.10, ge=0, le=1, description="a GPU a running job holds counts as idle "
                                  "(held_idle) for the share of a minute's samples its measured utilisation is "
                                  "below this fraction (passed to agents as BROKER_GPU_IDLE_BELOW)")
    gpu_sampler: str | None = Field(None, max_length=200, pattern=r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$",
                                    description="module:callable replacing the node agent's NVML reader "
                                                "(passed to agents as BROKER_GPU_SAMPLER; default: NVML)")
    restart_overhead_s: float | None = Field(
        None, ge=0, description="what a (re)start costs a job, for the selection policy; default 720 s "
                                "(0.2 h, as in the NSDI'24 paper), on the local backend its boot time plus a minute")
    # --- SkyPilot backend and cloud preemption notices (issue 4)
    skypilot_prefix: str = Field("broker-", pattern=r"^[a-z][-a-z0-9]*$",
                                 description="SkyPilot cluster names start with this; strays with it are torn down")
    skypilot_launch_timeout: float = Field(1800.0, gt=0, description="seconds a SkyPilot launch may take")
    skypilot_refresh_seconds: float = Field(10.0, gt=0, description="how often sky status / queue are re-read")
    skypilot_autostop_minutes: int | None = Field(60, ge=0, description="idle minutes before SkyPilot downs a cluster")
    skypilot_sdk: str | None = Field(None, max_length=200, pattern=r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$",
                                     description="skypilot backend: module:attribute of the SkyPilot SDK to call "
                                                 "(default: SkyPilot's own `sky`; a stand-in for tests)")
    api_host: str = Field("127.0.0.1", description="skypilot backend: where the notice API listens")
    api_port: int = Field(0, ge=0, le=65535, description="skypilot backend: notice API port (0: any free one)")
    sqs_queue_url: str | None = Field(None, description="SQS queue receiving EventBridge EC2 spot events")
    sqs_region: str | None = Field(None, description="region of the SQS queue (default: from its URL)")
    sqs_endpoint_url: str | None = Field(None, description="SQS endpoint override (VPC endpoint, tests)")

    # --- cost reports: SMTP, Slack, schedules, budgets (broker/reports) ---
    smtp_host: str | None = Field(None, description="SMTP server for emailed reports")
    smtp_port: int | None = Field(None, gt=0, lt=65536, description="default 587 (starttls), 465 (ssl), 25 (none)")
    smtp_tls: Literal["starttls", "ssl", "none"] = "starttls"
    smtp_user: str | None = None
    smtp_password: SecretStr | None = None
    smtp_from: str | None = Field(None, description="From address of report emails")
    smtp_ca_file: Path | None = Field(None, description="CA bundle trusted for the SMTP server's certificate")
    slack_webhook_url: SecretStr | None = Field(None, description="Slack incoming webhook")
    slack_token: SecretStr | None = Field(None, description="Slack bot token (xoxb-...), uploads the chart too")
    slack_channel: str | None = Field(None, description="channel the bot token posts to")
    slack_api_url: str = Field("https://slack.com/api/", description="Slack Web API base URL")
    delivery_attempts: int = Field(4, ge=1, description="tries per report delivery before it is marked failed")
    delivery_backoff_s: float = Field(2.0, ge=0, description="first retry delay, doubled on every retry")
    delivery_max_wait_s: float = Field(300.0, ge=0, description="longest Slack Retry-After honoured")
    reports: list[ReportSchedule] = Field(default_factory=list, description="scheduled reports")
    budgets: BudgetSettings = Field(default_factory=BudgetSettings, description="team budgets and alerts")

    # --- fair share across teams: weights, quotas, limits, a hierarchy (docs/fair-share.md) ---
    teams: Annotated[dict[str, TeamSettings], NoDecode] = Field(
        default_factory=dict, description="team -> {weight, quota_gpus, limit_gpus, parent}; teams not named share "
                                          "a weight of 1")
    fair_share_policy: str | None = Field(None, description="weighted_fair_share (the default once a team is "
                                          "named), fifo or static_quota")
    fair_share_half_life_seconds: float = Field(3600.0, gt=0, le=365 * 86400.0,
                                                description="recent GPU usage counts half after this long")

    @field_validator("teams", mode="before")
    @classmethod
    def _teams_from_json(cls, value: Any) -> Any:
        return teams_from_json(value) if isinstance(value, str) else value

    @field_validator("teams", mode="after")
    @classmethod
    def _teams_are_a_forest(cls, value: dict[str, TeamSettings]) -> dict[str, TeamSettings]:
        return check_teams(value)

    @field_validator("fair_share_policy")
    @classmethod
    def _known_fair_share_policy(cls, value: str | None) -> str | None:
        from policies import kinds

        try:
            return kinds.fair_share.check(value)
        except kinds.UnknownPolicy as exc:
            raise ValueError(str(exc)) from None

    # --- prices: endpoints, credentials and regions of the price pollers (`broker prices`) ---
    # The AWS endpoints keep boto3's own environment names; all others are BROKER_*.
    aws_endpoint_url_ec2: str | None = Field(
        None, validation_alias=AliasChoices("aws_endpoint_url_ec2", "AWS_ENDPOINT_URL_EC2"),
        description="EC2 endpoint for the catalog, spot prices and placement scores")
    aws_endpoint_url_pricing: str | None = Field(
        None, validation_alias=AliasChoices("aws_endpoint_url_pricing", "AWS_ENDPOINT_URL_PRICING"),
        description="AWS Price List endpoint for on-demand prices")
    aws_regions: Annotated[list[str] | None, NoDecode] = Field(None, description="default: six GPU regions")
    aws_placement_scores: bool = Field(True, description="ask AWS for spot placement scores")
    gcp_project: str | None = Field(None, description="default: the application default credentials' project")
    gcp_compute_endpoint: str | None = Field(None, description="Compute Engine API endpoint")
    gcp_billing_endpoint: str | None = Field(None, description="Cloud Billing Catalog API endpoint")
    gcp_api_key: str | None = Field(None, description="API key for the Billing Catalog")
    gcp_regions: Annotated[list[str] | None, NoDecode] = Field(None, description="default: every region")
    azure_prices_url: str = Field("https://prices.azure.com/api/retail/prices", description="Retail Prices API")
    azure_rm_endpoint: str | None = Field(None, description="Resource Manager endpoint for resource SKUs")
    azure_subscription_id: str | None = Field(None, description="adds zones and restrictions to Azure prices")
    azure_regions: Annotated[list[str] | None, NoDecode] = Field(None, description="default: ten GPU regions")
    gcp_capacity_advice: bool = Field(True, description="ask Compute Engine advice.capacity for spot "
                                      "obtainability and estimated uptime")
    azure_placement_scores: bool = Field(True, description="ask Azure for spot placement scores "
                                         "(needs a subscription)")
    gcp_capacity_history: bool = Field(True, description="ask Compute Engine advice.capacityHistory for the "
                                       "daily spot preemption rate and price history")
    price_backfill_days: float = Field(0.0, ge=0, le=90, description="on a process's first poll of a cloud, "
                                       "fill the price book with this many days of the cloud's spot price history "
                                       "(AWS price history, GCP capacityHistory); 0: off")
    capacity_request_interval_seconds: float = Field(
        0.05, ge=0, le=60, description="the least time between two capacity-signal requests to one cloud")
    capacity_cache_seconds: float = Field(600.0, ge=0, le=86400,
                                          description="how long a capacity signal answer is reused")
    price_retry_attempts: int = Field(6, ge=1, description="tries per API call on throttling and 5xx")
    price_retry_base_seconds: float = Field(0.5, gt=0, description="first backoff step (doubles, jittered)")
    price_max_age_seconds: float = Field(600.0, gt=0, le=30 * 86400,
                                         description="skypilot: an embedded launch polls the clouds first when the "
                                                     "newest quote for its accelerators is older than this")
    price_stale_seconds: float = Field(3600.0, gt=0, le=30 * 86400,
                                       description="skypilot: a quote not confirmed for this long counts as stale "
                                                   "(its spot capacity as none)")

    @field_validator("selection_policy", "placement_policy", "preemption_policy", "eager_policy")
    @classmethod
    def _known_policy(cls, value: str | None, info: ValidationInfo) -> str | None:
        from policies import kinds

        try:
            kind = {"selection_policy": "selection", "placement_policy": "placement",
                    "eager_policy": "eager"}.get(info.field_name or "", "preemption")
            return kinds.of(kind).check(value)
        except kinds.UnknownPolicy as exc:
            raise ValueError(str(exc)) from None

    @field_validator("queue_max_gpus", mode="after")
    @classmethod
    def _queue_limits(cls, value: dict[str, int]) -> dict[str, int]:
        from broker.spec.values import PRIORITY_CLASSES

        known = (*PRIORITY_CLASSES, "custom")
        for queue, gpus in value.items():
            if queue not in known:
                raise ValueError(f"unknown queue {queue[:60]!r}; expected one of {', '.join(known)}")
            if gpus < 1:
                raise ValueError(f"{queue}: GPUs must be at least 1, got {gpus}")
        return value

    @field_validator("aws_regions", "gcp_regions", "azure_regions", mode="before")
    @classmethod
    def _comma_separated(cls, value: Any) -> Any:
        if isinstance(value, str):
            return [part.strip() for part in value.split(",") if part.strip()]
        return value

    # --- serve: the long-running service, its API, leader election and schedules (broker serve) ---
    serve_host: str = Field("127.0.0.1", description="address `broker serve` listens on")
    serve_port: int = Field(8470, ge=0, lt=65536, description="port `broker serve` listens on (0: any free)")
    public_url: str | None = Field(None, description="URL node agents report notices to (must reach this machine "
                                                     "from the clouds); default http://host:port")
    token: SecretStr | None = Field(None, description="API token the CLI sends to --server")
    leader_check_seconds: float = Field(3.0, gt=0, description="how often leadership is tried or re-checked")
    reconcile_seconds: float = Field(30.0, gt=0, description="interval of the reconcile pass")
    price_poll_seconds: dict[str, float] = Field(
        default_factory=lambda: dict.fromkeys(PUBLIC_CLOUDS, 300.0),
        description="cloud -> seconds between price polls")
    # None: the built-in hook (broker/service/hooks.py), which imports these settings itself.
    price_poller: str | None = Field(None, description="module:function polling one cloud; default: the built-in "
                                                       "poller into the price book")
    report_check_seconds: float = Field(60.0, gt=0, description="how often due report schedules are looked for")
    report_runner: str | None = Field(None, description="module:function sending reports; default: the built-in "
                                                        "runner of due reports and budget alerts")
    capacity_gpus: int | None = Field(None, ge=1, description="GPUs running jobs may hold; shares are fractions of it")
    offline_catalog: bool = Field(False, description="validate submitted job files against the built-in catalog only")
    policy_schedules: list[PolicySchedule] = Field(default_factory=list, description="time-based policy changes")

    @field_validator("home", mode="after")
    @classmethod
    def _home_is_a_directory(cls, value: Path) -> Path:
        return check_home(value)

    @field_validator("db_url", mode="after")
    @classmethod
    def _db_url_is_a_database(cls, value: str | None) -> str | None:
        return None if value is None else check_db_url(value)

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
        raise ConfigError(f"invalid settings: {' '.join(problems.split())}") from None
    finally:
        _CONFIG_PATH = None
