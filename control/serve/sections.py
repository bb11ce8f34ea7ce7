"""Settings of the control loop: instances, gateway, predictor, controller, dispatch and jobs."""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, SecretStr, field_validator, model_validator

from steersman.control.serve.jobs import check_cron
from steersman.learners.bases import check_directory
from steersman.storage.settings import AbsolutePath


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid")


class InstanceSettings(_Section):
    """One serving instance: a real vLLM server (``url``) or a simulated one (``sim``)."""

    name: str | None = Field(default=None, description="Name in metrics and history.")
    url: str | None = Field(default=None, description="Base URL of a vLLM OpenAI server.")
    sim: str | None = Field(
        default=None,
        description="A simulated instance: a profile name or a calibration .json file.",
    )
    max_in_flight: int = Field(
        default=256,
        ge=1,
        le=100_000,
        description="Most requests steersman keeps at this instance (the KV admission decides "
        "below it); the rest wait in steersman's queue, ordered by predicted length.",
    )
    api_key: SecretStr | None = Field(default=None, description="Bearer token for the instance.")
    profile: str | None = Field(
        default=None,
        description="Step-time profile (name or .json file) the latency model starts from; "
        "empty: the sim profile, or a100-llama2-7b for a url.",
    )
    gpu: int | None = Field(
        default=None,
        ge=0,
        description="Index of the local GPU (as NVML numbers them) this instance runs on: its "
        "latency model then scales with that GPU's SM clock (a throttle is planned for at the "
        "next reading) against the boost clock of the profile's GPU. Empty: the instance's "
        "step times are learned from its outcomes alone.",
    )
    priority: bool = Field(
        default=True,
        description="Send vLLM priorities (the server runs --scheduling-policy priority); "
        "false: the server is treated as stock vLLM.",
    )
    predictions: bool = Field(
        default=False,
        description="With priority: also send steersman_predicted_tokens, which steersman's "
        "--scheduler-cls reads to order the waiting queue and choose preemption victims by "
        "predicted remaining length. Off by default: vLLM's built-in priority policy, fed "
        "steersman's priorities, measured as well or better (docs/benchmarks.md).",
    )

    @field_validator("sim", "profile")
    @classmethod
    def _profile_file(cls, value: str | None) -> str | None:
        """A calibration file is named by its absolute path; a profile name stays a name."""
        if value is not None and value.endswith(".json"):
            return str(Path(value).expanduser().absolute())
        return value

    @model_validator(mode="after")
    def _one_kind(self) -> InstanceSettings:
        if (self.url is None) == (self.sim is None):
            raise ValueError("give exactly one of url (a vLLM server) or sim (a profile)")
        if self.url is not None and not self.url.startswith(("http://", "https://")):
            raise ValueError(f"url {self.url!r} must start with http:// or https://")
        return self

    @property
    def label(self) -> str:
        return self.name or (self.url or f"sim-{self.sim}")


class GatewaySettings(_Section):
    host: str = Field(default="127.0.0.1", description="Address to bind; loopback by default.")
    port: int = Field(default=8000, ge=0, le=65535, description="Port to listen on.")
    api_keys: list[SecretStr] = Field(
        default_factory=list, description="Bearer keys for /v1; empty means no key is needed."
    )
    admin_api_keys: list[SecretStr] = Field(
        default_factory=list, description="Bearer keys for /admin; empty means no key is needed."
    )
    max_body_bytes: int = Field(
        default=4_000_000, ge=1024, description="Larger request bodies get 413."
    )
    connect_timeout_s: float = Field(default=2.0, gt=0, description="Connect deadline upstream.")
    read_timeout_s: float = Field(
        default=120.0, gt=0, description="Longest silence on an upstream stream."
    )
    drain_timeout_s: float = Field(
        default=30.0, ge=0, description="On SIGTERM, how long in-flight requests may finish."
    )


class ServiceSettings(_Section):
    """What the loop's shell does with a request between intake and outcome, whichever front
    door it came through (gateway or endpoint picker)."""

    queue_timeout_s: float = Field(
        default=120.0, gt=0, description="Longest wait in steersman's queue before a 503."
    )
    retries: int = Field(
        default=1, ge=0, le=5, description="Retries elsewhere of a request that never started."
    )
    health_interval_s: float = Field(default=2.0, gt=0, description="Instance /health period.")
    health_failures: int = Field(
        default=3,
        ge=1,
        description="Failed /health probes in a row that mark an instance down (a busy server "
        "can be slow to answer one; a request that cannot reach it marks it down at once).",
    )


class EppSettings(_Section):
    """steersman as the endpoint picker behind Envoy (``steersman epp``): Envoy's ext_proc
    filter asks it where each request goes, and Envoy carries the bytes."""

    enabled: bool = Field(
        default=False, description="Serve Envoy's ext_proc gRPC API (steersman epp sets it)."
    )
    host: str = Field(default="127.0.0.1", description="Address the gRPC server binds.")
    port: int = Field(default=9002, ge=0, le=65535, description="gRPC port (0: any free one).")


class PredictorSettings(_Section):
    model_dir: AbsolutePath | None = Field(
        default=None,
        description="RoBERTa length model directory; empty uses the latest promoted version "
        "in the registry, or the fast feature-only predictor when there is none.",
    )
    tokenizer_dir: AbsolutePath | None = Field(
        default=None,
        description="The served model's tokenizer (tokenizer.json) for prompt token counts.",
    )
    deadline_ms: float = Field(
        default=25.0, gt=0, description="Longest wait for RoBERTa before the fast prediction."
    )
    max_batch: int = Field(default=32, ge=1, description="Most prompts in one inference batch.")
    max_wait_ms: float = Field(default=2.0, ge=0, description="Longest wait to fill a batch.")
    device: str = Field(default="cpu", description="cpu or cuda[:N].")
    quantize: bool = Field(
        default=True,
        description="On CPU, serve RoBERTa's linear layers in dynamic int8 (several times "
        "faster, the same predictions to within a few tokens), so fewer requests miss the "
        "deadline and take the fast path.",
    )
    threads: int | None = Field(
        default=1,
        ge=1,
        description="torch intra-op threads for RoBERTa on CPU (the whole daemon process). One "
        "keeps inference in milliseconds beside busy neighbours such as vLLM servers on the "
        "same cores; empty: torch's default (all cores).",
    )
    max_tokens_is_length: bool = Field(
        default=False,
        description="Benchmarks and the demo: clients set max_tokens to the true response "
        "length (with ignore_eos), so it is neither used as a hint nor treated as a cut-off.",
    )
    corrector_lr: float = Field(
        default=0.005,
        gt=0,
        description="Corrector learning rate of its feature weights (its offset per request "
        "class learns faster); higher adapts to drift sooner and orders requests worse.",
    )
    band_coverage: float = Field(
        default=0.8,
        gt=0,
        lt=1,
        description="Share of actual lengths each request class's band aims to hold (0.8: the "
        "10th to 90th percentile of recent errors); misses are judged against it.",
    )
    band_window: int = Field(
        default=500, ge=20, description="Recent outcomes per class the band is calibrated on."
    )
    max_tokens: int = Field(
        default=32768, ge=1, description="Upper clamp of predictions without max_tokens."
    )
    prefix_prior_entries: int = Field(
        default=200_000,
        ge=0,
        description="Shared prompt prefixes whose answer lengths the prefix prior remembers "
        "(least recently used go first; a few dozen bytes each); 0: no prefix prior. Needs "
        "tokenizer_dir (prompts are hashed in the served model's tokens).",
    )
    similar_prompts: int = Field(
        default=4096,
        ge=0,
        description="Recent prompts whose vectors and answer lengths the similar-prompt prior "
        "remembers (its prediction leans toward what the served model answered to the 30 most "
        "similar; about 1.5 kB each, in memory and in checkpoints); 0: no similar-prompt "
        "prior. Needs a length model with a pooled head (what steersman train makes).",
    )
    base_model: AbsolutePath | None = Field(
        default=None,
        description="Pretrained encoder that retraining fine-tunes from (any local Hugging Face "
        "encoder directory, e.g. roberta-base); empty: the packaged all-MiniLM-L6-v2 where it "
        "is installed, else a RoBERTa trained from scratch.",
    )

    @field_validator("base_model")
    @classmethod
    def _base(cls, value: Path | None) -> Path | None:
        if value is not None:
            check_directory(value)  # the file that is missing, named
        return value


class JobsSettings(_Section):
    checkpoint_interval_s: float = Field(
        default=30.0, gt=0, description="Learner, compensation and controller checkpoints."
    )
    retrain_interval_s: float | None = Field(
        default=None, gt=0, description="Retrain the length model from the history this often."
    )
    retrain_cron: str | None = Field(
        default=None, description="Or on a crontab schedule, e.g. '0 3 * * *'."
    )

    @field_validator("retrain_cron")
    @classmethod
    def _cron(cls, value: str | None) -> str | None:
        if value is not None:
            check_cron(value)  # APScheduler reads crontabs
        return value

    retrain_on_fallback: bool = Field(
        default=True, description="Queue an early retraining when the controller falls back."
    )
    retrain_budget_s: float = Field(default=600.0, gt=0, description="Time budget of a retrain.")
    retrain_rows: int = Field(default=20_000, ge=100, description="Most recent rows to train on.")
    retrain_min_gain: float = Field(
        default=0.02,
        ge=0,
        lt=1,
        description="A candidate replaces the served model only if its validation MAE (log) is "
        "at least this share lower: a swap on noise resets the corrector for nothing.",
    )
    telemetry_retention_days: float = Field(
        default=14.0, gt=0, description="Telemetry older than this is deleted."
    )
    downsample_after_days: float = Field(
        default=1.0, gt=0, description="Telemetry older than this is kept one row per minute."
    )
    retention_interval_s: float = Field(default=3600.0, gt=0, description="Retention job period.")
