"""The one settings tree: built once at the entry point from TOML, env and flags."""

from __future__ import annotations

import os
import tomllib
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, SecretStr, ValidationError, field_validator, model_validator
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict

from steersman.control.core.settings import ControllerSettings, DispatchSettings, QoeSettings
from steersman.control.serve.sections import (
    EppSettings,
    GatewaySettings,
    InstanceSettings,
    JobsSettings,
    PredictorSettings,
    ServiceSettings,
)
from steersman.dashboard.settings import DashboardSettings
from steersman.storage.engine import mask_url
from steersman.storage.settings import StorageSettings
from steersman.telemetry.settings import TelemetrySettings

ENV_PREFIX = "STEERSMAN_"
MOVED = [
    ("dispatch", "queue_timeout_s"),
    ("gateway", "retries"),
    ("gateway", "health_failures"),
    ("gateway", "health_interval_s"),
]
ENV_DELIMITER = "__"


class ConfigError(Exception):
    """A configuration problem, phrased for the operator: the field, the value, and why."""


class Settings(BaseSettings):
    """Everything steersman can be told. Precedence: flags > environment > TOML file > defaults."""

    model_config = SettingsConfigDict(
        env_prefix=ENV_PREFIX,
        env_nested_delimiter=ENV_DELIMITER,
        extra="forbid",
        validate_default=True,
    )

    data_dir: Path = Field(
        default=Path("~/.local/share/steersman"),
        description="Directory for the SQLite history, spill files, models and checkpoints.",
    )
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = Field(
        default="INFO",
        description="Logging level of steersman's own messages (instances up and down, "
        "FALLBACK, retraining, errors).",
    )
    log_libraries: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = Field(
        default="WARNING",
        description="Logging level of the libraries steersman runs on (httpx's every request, "
        "uvicorn, APScheduler, transformers): INFO or DEBUG to see their probes and scrapes.",
    )
    storage: StorageSettings = Field(
        default_factory=StorageSettings, description="The SQL history and its writer."
    )
    telemetry: TelemetrySettings = Field(
        default_factory=TelemetrySettings, description="GPU sampling through NVML and vLLM scrapes."
    )

    replica: str = Field(
        default="",
        description="This replica's name in the shared history (its checkpoints); several "
        "replicas in front of the same servers share one PostgreSQL history. Empty: the host "
        "name and data directory.",
    )

    instances: list[InstanceSettings] = Field(
        default_factory=list,
        description="The serving instances, as [[instances]] tables with url or sim.",
    )
    gateway: GatewaySettings = Field(
        default_factory=GatewaySettings, description="The OpenAI-compatible HTTP gateway."
    )
    service: ServiceSettings = Field(
        default_factory=ServiceSettings,
        description="Queueing, retries and instance health, for the gateway and the picker.",
    )
    epp: EppSettings = Field(
        default_factory=EppSettings, description="The endpoint picker behind Envoy."
    )
    predictor: PredictorSettings = Field(
        default_factory=PredictorSettings, description="Length prediction: RoBERTa and River."
    )
    controller: ControllerSettings = Field(
        default_factory=ControllerSettings, description="Misses, fallback and compensation."
    )
    dispatch: DispatchSettings = Field(
        default_factory=DispatchSettings, description="Dispatch policy and steersman's queue."
    )
    qoe: QoeSettings = Field(
        default_factory=QoeSettings,
        description="Streamed quality of experience: what readers expect, and the QoE-aware "
        "order and preemption inside the engines (off by default).",
    )
    dashboard: DashboardSettings = Field(
        default_factory=DashboardSettings, description="The Streamlit dashboard."
    )
    jobs: JobsSettings = Field(
        default_factory=JobsSettings, description="Periodic jobs of the daemon."
    )

    @field_validator("instances")
    @classmethod
    def _distinct(cls, instances: list[InstanceSettings]) -> list[InstanceSettings]:
        """Names and URLs are unique; unnamed instances that would share a name are numbered."""
        seen: dict[str, int] = {}
        for k, spec in enumerate(instances):
            if spec.name is not None:
                if spec.name in seen:
                    raise ValueError(
                        f"instances[{seen[spec.name]}] and instances[{k}] are both named "
                        f"{spec.name!r}"
                    )
                seen[spec.name] = k
        urls: dict[str, int] = {}
        for k, spec in enumerate(instances):
            if spec.url is not None:
                url = spec.url.rstrip("/")
                if url in urls:
                    raise ValueError(
                        f"instances[{urls[url]}] and instances[{k}] both point at {spec.url}"
                    )
                urls[url] = k
        labels = [spec.label for spec in instances]
        named = []
        for k, spec in enumerate(instances):
            label = spec.label
            if spec.name is None and (labels.count(label) > 1 or label in seen):
                n = 1 + sum(1 for other in labels[:k] if other == label)
                while f"{label}-{n}" in seen:
                    n += 1
                label = f"{label}-{n}"
            seen.setdefault(label, k)
            named.append(spec if spec.name else spec.model_copy(update={"name": label}))
        return named

    @model_validator(mode="before")
    @classmethod
    def _moved(cls, data: Any) -> Any:
        """Fields that moved to the section of the part they drive are named where they went."""
        if isinstance(data, dict):
            for section, name in MOVED:
                old = data.get(section)
                if isinstance(old, dict) and name in old:
                    raise ValueError(f"{section}.{name} is now service.{name}")
        return data

    @model_validator(mode="after")
    def _picked_servers_have_urls(self) -> Settings:
        if self.epp.enabled:
            for k, spec in enumerate(self.instances):
                if spec.url is None:
                    raise ValueError(
                        f"instances[{k}].sim = {spec.sim!r}: the endpoint picker (epp) picks "
                        "servers that Envoy reaches, instances with a url"
                    )
        return self

    @field_validator("data_dir")
    @classmethod
    def _expand(cls, value: Path) -> Path:
        return value.expanduser().absolute()

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        # The TOML file arrives as init arguments; the environment overrides it.
        return (env_settings, init_settings)

    @property
    def database_url(self) -> str:
        return self.storage.url or f"sqlite:///{self.data_dir / 'steersman.db'}"

    @property
    def spill_dir(self) -> Path:
        return self.storage.spill_dir or self.data_dir / "spill"


def load_settings(
    config_file: Path | None = None,
    overrides: dict[str, Any] | None = None,
    environ: dict[str, str] | None = None,
) -> Settings:
    """Build the settings tree, or raise ConfigError naming the field, the value and the reason.

    ``overrides`` are command-line flags as a nested dict, e.g. ``{"storage": {"url": ...}}``.
    """
    file_data = _read_toml(config_file) if config_file else {}
    env = os.environ if environ is None else environ
    try:
        settings = Settings(**file_data)
    except ValidationError as exc:
        raise ConfigError(_describe(exc, config_file, env)) from None
    return derive(settings, overrides) if overrides else settings


def derive(settings: Settings, overrides: dict[str, Any]) -> Settings:
    """``settings`` with ``overrides`` merged in (a nested dict, as flags give). The environment
    is not read again: the overrides win."""
    try:
        return _Derived(**_deep_merge(settings.model_dump(), overrides))
    except ValidationError as exc:
        raise ConfigError(_describe(exc, None, {})) from None


class _Derived(Settings):
    """Settings validated from values alone: the environment was applied already."""

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        **_: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        return (init_settings,)


def _read_toml(path: Path) -> dict[str, Any]:
    try:
        with open(path, "rb") as fh:
            return tomllib.load(fh)
    except FileNotFoundError:
        raise ConfigError(f"config file {path}: not found") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"config file {path}: not valid TOML: {exc}") from None
    except OSError as exc:
        raise ConfigError(f"config file {path}: {exc.strerror}") from None


def _deep_merge(base: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in extra.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = _deep_merge(out[key], value)
        else:
            out[key] = value
    return out


def _describe(exc: ValidationError, config_file: Path | None, env: dict[str, str]) -> str:
    lines = []
    for err in exc.errors():
        loc = [str(part) for part in err["loc"]]
        field = ".".join(loc)
        env_name = ENV_PREFIX + ENV_DELIMITER.join(loc).upper()
        if env_name in env:
            where = f" (from {env_name})"
        elif config_file is not None:
            where = f" (in {config_file})"
        else:
            where = ""
        value = err.get("input")
        if not loc:  # a rule across sections names its fields itself
            lines.append(f"config error{where}: {err['msg'].removeprefix('Value error, ')}")
            continue
        hidden = err["type"] == "missing" or isinstance(value, list)
        shown = "" if hidden else f" = {_shorten(value)!r}"
        lines.append(f"config error: {field}{shown}{where}: {err['msg']}")
    return "\n".join(lines)


def _shorten(value: Any) -> Any:
    if isinstance(value, dict):
        return "{...}"
    if isinstance(value, str) and len(value) > 120:
        return value[:117] + "..."
    return value


SECRET_MASK = "***"


def masked(settings: Settings) -> dict[str, Any]:
    """The effective settings as plain data, with passwords in URLs and secret values masked."""
    return _mask(settings.model_dump(mode="python"), key="")


def _mask(value: Any, key: str) -> Any:
    if isinstance(value, SecretStr):
        return SECRET_MASK if value.get_secret_value() else ""
    if isinstance(value, dict):
        return {k: _mask(v, k) for k, v in value.items()}
    if isinstance(value, list):
        return [_mask(v, key) for v in value]
    if isinstance(value, str) and key.endswith("url"):
        return mask_url(value)
    if isinstance(value, Path):
        return str(value)
    return value
