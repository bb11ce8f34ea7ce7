"""Step-time profiles of a simulated vLLM instance: ``a + b*prefill + c*seqs + d*ctx + e*joins``.

- ``cpu-tiny``: measured on the project's 2-core development machine with
  ``steersman calibrate`` against vLLM CPU 0.32.0 serving the tiny demo model (one core, float32).
  Beyond the four coefficients it has ``e``, the engine time each newly admitted request costs
  (about 3 ms there, more than its prefill tokens), and an admission delay that is longer when
  the engine is idle (``wake_s``); the GPU profiles leave both at 0.
- ``a100-llama2-7b``, ``h100-llama3-8b`` and ``a30-llama2-7b``: derived, not measured, from
  published figures: HBM bandwidth and dense BF16 throughput from NVIDIA's A100 80 GB (2,039 GB/s,
  312 TFLOPS), H100 SXM (3,350 GB/s, 989 TFLOPS) and A30 24 GB (933 GB/s, 165 TFLOPS) data sheets;
  model shapes from the Llama 2 and Llama 3 papers (7B: 32 layers, hidden 4096, 32 KV heads; 8B:
  32 layers, 8 KV heads of 128). The A30 with Llama-2-7B is Block's testbed: 13.5 GB of weights
  leave about 18,000 tokens of KV cache, so it is memory-bound (a few requests fill it). ``a`` is
  reading the weights once per step (bytes / bandwidth) plus 2 ms of framework overhead; ``b`` is
  2 * parameters FLOP per prefill token at 50% utilisation; ``c`` a per-sequence sampling and
  bookkeeping cost; ``d`` reading one token's K and V for every layer (bytes / bandwidth);
  KV blocks fill 90% of memory after the weights.
"""

from __future__ import annotations

import json
import math
from dataclasses import MISSING, asdict, dataclass, fields
from pathlib import Path

from steersman.learners.latency import StepCoefficients


@dataclass(frozen=True)
class StepModel:
    """One engine step: ``a + b*prefill_tokens + c*decode_seqs + d*context_tokens + e*joins`` s,
    ``joins`` being the requests whose prefill begins in the step."""

    name: str
    a: float
    b: float
    c: float
    d: float
    num_blocks: int
    block_size: int = 16
    max_num_seqs: int = 256
    max_num_batched_tokens: int = 2048
    max_model_len: int = 4096
    admission_s: float = 0.0  # API server work before a request reaches the engine's queue
    wake_s: float = 0.0  # more of it when the engine is idle (it sleeps on its input queue)
    e: float = 0.0  # per request whose prefill begins in the step (engine-side setup)
    # The SM clock the step times hold at (``steersman calibrate --gpu``: read while the GPU
    # worked); 0: the boost clock of the profile's GPU, which the derived profiles assume.
    clock_mhz: float = 0.0
    source: str = ""

    def admission(self, engine_busy: bool) -> float:
        """From the request's arrival at the API server to its place in the engine's queue."""
        return self.admission_s if engine_busy else self.admission_s + self.wake_s

    def step_time(
        self, prefill_tokens: int, decode_seqs: int, context_tokens: int, joins: int = 0
    ) -> float:
        return (
            self.a
            + self.b * prefill_tokens
            + self.c * decode_seqs
            + self.d * context_tokens
            + self.e * joins
        )

    def coefficients(self, context_tokens: int = 512) -> StepCoefficients:
        """The step model at a typical context, as the latency model's starting point."""
        return StepCoefficients(self.a, self.c + self.d * context_tokens, self.b)

    def save(self, path: Path) -> None:
        path.write_text(json.dumps(asdict(self), indent=2) + "\n")


def _gpu(
    name: str,
    params_b: float,
    bandwidth: float,
    tflops: float,
    kv_bytes_per_token: float,
    memory_gb: float,
    max_model_len: int,
) -> StepModel:
    weights = params_b * 1e9 * 2
    tokens = 0.9 * (memory_gb * 1e9 - weights) / kv_bytes_per_token
    return StepModel(
        name=name,
        a=weights / (bandwidth * 1e9) + 0.002,
        b=2 * params_b * 1e9 / (0.5 * tflops * 1e12),
        c=0.00004,
        d=kv_bytes_per_token / (bandwidth * 1e9),
        num_blocks=int(tokens // 16),
        max_num_seqs=256,
        max_num_batched_tokens=8192,
        max_model_len=max_model_len,
        source="derived from published data sheet and model figures (see module docstring)",
    )


PROFILES: dict[str, StepModel] = {
    # 2 * 32 layers * 4096 * 2 bytes = 512 KiB of K and V per token.
    "a100-llama2-7b": _gpu("a100-llama2-7b", 6.74, 2039, 312, 2 * 32 * 4096 * 2, 80, 4096),
    # 2 * 32 layers * 8 KV heads * 128 * 2 bytes = 128 KiB per token.
    "h100-llama3-8b": _gpu("h100-llama3-8b", 8.03, 3350, 989, 2 * 32 * 8 * 128 * 2, 80, 8192),
    "a30-llama2-7b": _gpu("a30-llama2-7b", 6.74, 933, 165, 2 * 32 * 4096 * 2, 24, 4096),
    # More GPUs and models, for sweeps of the KV-to-compute ratio (the defaults must hold beyond
    # the profiles they were chosen on): L4 24 GB (300 GB/s, 121 TFLOPS), A10 24 GB (600 GB/s,
    # 125 TFLOPS), L40S 48 GB (864 GB/s, 362 TFLOPS); Llama-2-13B: 40 layers, hidden 5120, 40 KV
    # heads (800 KiB of K and V per token).
    "l4-llama2-7b": _gpu("l4-llama2-7b", 6.74, 300, 121, 2 * 32 * 4096 * 2, 24, 4096),
    "a10-llama2-7b": _gpu("a10-llama2-7b", 6.74, 600, 125, 2 * 32 * 4096 * 2, 24, 4096),
    "l40s-llama2-7b": _gpu("l40s-llama2-7b", 6.74, 864, 362, 2 * 32 * 4096 * 2, 48, 4096),
    "l40s-llama2-13b": _gpu("l40s-llama2-13b", 13.0, 864, 362, 2 * 40 * 5120 * 2, 48, 4096),
    "a100-llama2-13b": _gpu("a100-llama2-13b", 13.0, 2039, 312, 2 * 40 * 5120 * 2, 80, 4096),
    "h100-llama2-13b": _gpu("h100-llama2-13b", 13.0, 3350, 989, 2 * 40 * 5120 * 2, 80, 4096),
    # `python -m benchmarks.sim_fidelity` calibrates the vLLM CPU 0.32.0 server it starts (tiny
    # model, one core, float32, 1 GiB KV cache) on the 2-core development machine.
    "cpu-tiny": StepModel(
        name="cpu-tiny",
        a=0.00183,
        b=0.0000168,
        c=0.0000719,
        d=0.000000327,
        num_blocks=32768,
        block_size=16,
        max_num_seqs=256,
        max_num_batched_tokens=2048,
        max_model_len=1024,
        admission_s=0.00232,
        wake_s=0.00413,
        e=0.00308,
        source="steersman calibrate against vLLM CPU 0.32.0 and the tiny model",
    ),
}


def load_profile(name_or_path: str) -> StepModel:
    """A named profile, or a JSON file written by ``steersman calibrate``; a file that does not
    parse is refused with its name, and the field or the line that is wrong."""
    if name_or_path in PROFILES:
        return PROFILES[name_or_path]
    path = Path(name_or_path)
    if path.suffix != ".json" or not path.exists():
        raise ValueError(
            f"unknown simulator profile {name_or_path!r}; "
            f"known: {', '.join(PROFILES)} or a calibration .json file"
        )
    try:
        data = json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise ValueError(f"profile {path}:{exc.lineno}: not valid JSON: {exc.msg}") from None
    if not isinstance(data, dict):
        raise ValueError(f"profile {path}: a JSON object of step-model fields is due")
    known = {f.name: f for f in fields(StepModel)}
    for key, value in data.items():
        if key not in known:
            raise ValueError(f"profile {path}: unknown field {key!r}")
        numeric = known[key].type in ("float", "int")
        if numeric and (isinstance(value, bool) or not isinstance(value, int | float)):
            raise ValueError(f"profile {path}: field {key} = {value!r} is not a number")
        if numeric and (not math.isfinite(value) or value < 0):
            raise ValueError(f"profile {path}: field {key} = {value!r} must be >= 0")
    missing = [n for n, f in known.items() if n not in data and f.default is MISSING]
    if missing:
        raise ValueError(f"profile {path}: missing field(s) {', '.join(missing)}")
    return StepModel(**data)
