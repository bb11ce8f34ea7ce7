"""Serving instances at run time: a backend, its latency model and what was last measured of it."""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from steersman.control.backends.base import Backend, GenerationResult
from steersman.control.backends.sim import SimBackend
from steersman.control.backends.vllm_http import VllmHttpBackend
from steersman.control.core.scheduler import InstanceState
from steersman.control.core.settings import QoeSettings
from steersman.control.serve.intake import Job
from steersman.control.serve.sections import GatewaySettings, InstanceSettings
from steersman.control.sim.gpu import reference_clock_mhz
from steersman.control.sim.profiles import load_profile
from steersman.learners.latency import LatencyModel, StepCoefficients

DEFAULT_URL_PROFILE = "a100-llama2-7b"


@dataclass
class Instance:
    """One serving instance. ``kv_usage`` and ``waiting`` come from the engine (simulated) or
    its /metrics (vLLM); ``coefficients`` cache the latency model's step times, re-read when it
    learns or the load is read, so a decision costs no model evaluation; ``telemetry`` gives
    the readings of the GPU it runs on (nothing when that is not known)."""

    name: str
    backend: Backend
    latency: LatencyModel
    cap: int = 32
    send_priority: bool = True
    send_predictions: bool = False  # for steersman's vLLM scheduler class
    healthy: bool = True
    failed_probes: int = 0  # /health probes failed in a row
    streaming: bool = False  # a stream from it produced events since the last probe
    kv_usage: float | None = None
    waiting: int = 0
    others: int = 0  # requests at the server that another steersman replica sent
    kv_capacity: int | None = None  # KV cache tokens, from the profile or vLLM's /metrics
    block: int = 16
    coefficients: StepCoefficients | None = None
    # Uncached prompt tokens of the requests whose first token came from it so far: the prefill
    # those decoding meanwhile waited behind (requests another replica sent are not seen).
    prefilled: int = 0
    telemetry: Callable[[float | None], Mapping[str, Any]] = field(default=lambda _: {})

    def gpu(self, since: float | None = None) -> Mapping[str, Any]:
        """Its GPU's readings, of the last window or since ``since`` (monotonic seconds)."""
        try:
            return self.telemetry(since)
        except Exception:  # telemetry is advisory: a failing source costs features, not requests
            return {}

    def refresh(self, now: float | None = None) -> None:
        """Read the latency model again; ``now`` (the service's clock) lets what it learned
        fade while the instance finishes nothing."""
        self.coefficients = self.latency.coefficients(self.gpu(), now)

    def prefill_done(self, job: Job, result: GenerationResult) -> int:
        """Count the prefill of ``job``, whose first token just came, as done here (its prompt
        less what was cached, as vLLM reported them, else as steersman expected); returns the
        count, from which ``job`` measures the prefill it decodes beside."""
        reported = result.prompt_tokens  # the upstream's JSON: trusted only as a count
        prompt = reported if _count(reported) else job.arrival.prompt_tokens
        cached = result.cached_tokens
        if not _count(cached):
            cached = job.assignment.cached_tokens if job.assignment is not None else 0
        self.prefilled += max(prompt - cached, 0)
        return self.prefilled

    def step_times(self) -> dict[str, float | None]:
        """One decode step with one sequence, learned and profiled (for the history)."""
        learned = self.coefficients.step(1) if self.coefficients is not None else None
        return {"step_s": learned, "profiled_step_s": self.latency.prior.step(1)}

    def state(self) -> InstanceState:
        if self.coefficients is None:
            self.refresh()
        assert self.coefficients is not None
        return InstanceState(
            self.name,
            healthy=self.healthy,
            cap=self.cap,
            kv_usage=self.kv_usage,
            waiting=self.waiting,
            others=self.others,
            step=self.coefficients,
            kv_capacity=self.kv_capacity,
            block=self.block,
            ranks=self.send_predictions,
        )


def make_instance(
    spec: InstanceSettings,
    gateway: GatewaySettings,
    count: Callable[[str], int] | None,
    gpu_features: Callable[[int, float | None], Mapping[str, Any]] | None = None,
    qoe: QoeSettings | None = None,
) -> Instance:
    """``gpu_features(index, since)``: the telemetry sampler's readings of one local GPU, for
    instances that name theirs (``gpu``): their latency model then follows that GPU's clock.
    ``qoe``: the streamed-QoE rule a simulated instance's engine applies, as steersman's vLLM
    scheduler class does."""
    profile = load_profile(spec.profile or spec.sim or DEFAULT_URL_PROFILE)
    capacity, block = None, 16
    if spec.sim is not None:
        sim = load_profile(spec.sim)
        backend: Any = SimBackend(spec.label, sim, count_tokens=count, qoe=qoe)
        capacity, block = sim.num_blocks * sim.block_size, sim.block_size
    else:
        key = spec.api_key.get_secret_value() if spec.api_key else None
        backend = VllmHttpBackend(
            spec.label,
            spec.url or "",
            connect_timeout_s=gateway.connect_timeout_s,
            read_timeout_s=gateway.read_timeout_s,
            api_key=key,
        )
    index = spec.gpu
    watched = index is not None and gpu_features is not None
    instance = Instance(
        spec.label,
        backend,
        LatencyModel(
            profile.coefficients(),
            reference_clock_mhz=reference_clock_mhz(profile) if watched else None,
        ),
        cap=spec.max_in_flight,
        send_priority=spec.priority,
        send_predictions=spec.priority and spec.predictions,
        kv_capacity=capacity,
        block=block,
    )
    if watched:
        instance.telemetry = functools.partial(gpu_features, index)  # type: ignore[arg-type]
    return instance


def _count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0
