"""The latency model: one instance's decode step time and prefill cost, learned online.

A step takes the instance's profiled time (``prior``, at the profile's clock), times what the
GPU's telemetry says of its speed now (``reference / sm_clock``: a throttled GPU decodes slower,
seen at the next reading, before any request finishes), times two learned residuals, each an
exponentially weighted mean (River's ``EWMean``) over finished requests:

- the speed: ``log(observed TPOT / expected TPOT)``, what the profile and the clock do not carry
  (another GPU than profiled, a noisy neighbour, the serving stack);
- the prefill interference: ``log(expected TPOT / decode step)``, the share of each step that
  went to other requests' prefills while this one decoded.

Given the prefill tokens the instance computed while a request decoded (``prefill_tokens`` over
``decode_steps``), its expected TPOT is a decode step plus that prefill's cost per step. Without
them the speed carries the interference too, as one noisy mean. With them the speed is nearly
free of noise (how much prefill lands beside a request is what makes TPOTs differ most), so it
follows a slower GPU within a few dozen outcomes, while the interference, a matter of load,
is averaged slowly (``interference_alpha``). One factor scales the decode base, the per-sequence
cost and the prefill cost alike: what slows one slows the others.

What was learned goes stale when an instance stops finishing requests: judged slow, it gets
none at light load, so no outcome could show that it has recovered (a neighbour gone, a fan
mended). From ``forget_after_s`` after its last outcome the residual's weight halves every
``half_life_s`` (times are the caller's ``now``), so the instance drifts back to its profile and
is tried again; the next outcome then weighs against that much belief only (after a long silence
it says most of what is known, so one probe of an instance still slow sends it back). An
instance that keeps finishing requests never forgets: at load nothing changes.

Telemetry that is missing, not finite, or outside a plausible range (``clock_range`` times the
reference) is ignored and counted; the model then plans with the prior's clock and says so once
(``status``, the log).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from river import stats

log = logging.getLogger(__name__)

CLOCK_KEYS = ("sm_clock_mhz", "sm_clock_mhz_mean")  # a reading, or a sampler window's mean


@dataclass(frozen=True)
class StepCoefficients:
    """``step(n) = base_s + per_seq_s * n``; prefill costs ``prefill_s_per_token`` a token."""

    base_s: float
    per_seq_s: float
    prefill_s_per_token: float

    def scaled(self, factor: float) -> StepCoefficients:
        return StepCoefficients(
            self.base_s * factor, self.per_seq_s * factor, self.prefill_s_per_token * factor
        )

    def step(self, n: float) -> float:
        return self.base_s + self.per_seq_s * n


class LatencyModel:
    """``learn_one(x, tpot_s)`` after each finished request (``x``: ``running``, the batch it
    decoded in, ``prefill_tokens`` and ``decode_steps`` when known, and telemetry:
    ``sm_clock_mhz``); ``coefficients(x)`` and ``predict_one(x)`` for dispatch.

    >>> m = LatencyModel(StepCoefficients(0.01, 0.001, 0.0001), reference_clock_mhz=1400)
    >>> round(m.predict_one({"running": 4}), 4)  # the prior
    0.014
    >>> round(m.predict_one({"running": 4, "sm_clock_mhz": 700}), 4)  # half the clock
    0.028
    >>> for _ in range(200):  # a neighbour slows every step by half again
    ...     m.learn_one({"running": 4, "sm_clock_mhz": 1400}, 0.021)
    >>> round(m.predict_one({"running": 4, "sm_clock_mhz": 1400}), 4)
    0.021

    Prefill beside a request is told apart from a slower GPU: the steps it decoded in took
    0.014 s plus 70 prefill tokens at 0.1 ms over 10 steps, 0.0147 s, and the GPU is as fast
    as profiled:

    >>> p = LatencyModel(StepCoefficients(0.01, 0.001, 0.0001))
    >>> for _ in range(300):
    ...     p.learn_one({"running": 4, "prefill_tokens": 70, "decode_steps": 10}, 0.0147)
    >>> round(p.speed({}), 3), round(p.predict_one({"running": 4}), 4)
    (1.0, 0.0147)

    With ``now``, what was learned fades once the instance stops finishing requests:

    >>> m.learn_one({"running": 4, "sm_clock_mhz": 1400}, 0.021, now=100.0)
    >>> [round(m.predict_one({"running": 4}, now=t), 4) for t in (110, 130, 160, 400)]
    [0.021, 0.021, 0.0155, 0.014]
    """

    def __init__(
        self,
        prior: StepCoefficients,
        *,
        reference_clock_mhz: float | None = None,
        alpha: float = 0.05,
        interference_alpha: float = 0.01,
        warmup: int = 5,
        clock_range: tuple[float, float] = (0.2, 1.5),
        max_step_s: float = 10.0,
        forget_after_s: float = 30.0,
        half_life_s: float = 15.0,
    ) -> None:
        self.prior = prior
        self.reference_clock_mhz = reference_clock_mhz
        self.warmup = warmup
        self.clock_range = clock_range
        self.max_step_s = max_step_s
        self.forget_after_s = forget_after_s
        self.half_life_s = half_life_s
        self.residual = stats.EWMean(alpha)  # the speed
        self.interference = stats.EWMean(interference_alpha)
        self.learned = 0
        self.learned_at: float | None = None  # the caller's time of the last outcome
        self.telemetry_ignored = 0  # readings refused: missing, NaN, out of range
        self.status = "prior" if reference_clock_mhz is None else "telemetry"
        self._said = False

    # -- telemetry ------------------------------------------------------------------------------

    def clock_factor(self, x: Mapping[str, Any]) -> float:
        """``reference / clock``: 1 without a reference clock; 1, counted, when the reading
        cannot be used."""
        ref = self.reference_clock_mhz
        if ref is None:
            return 1.0
        clock = next((x[k] for k in CLOCK_KEYS if x.get(k) is not None), None)
        lo, hi = self.clock_range
        usable = (
            isinstance(clock, int | float)
            and not isinstance(clock, bool)
            and math.isfinite(clock)
            and lo * ref <= clock <= hi * ref
        )
        if not usable:
            self._refuse(clock)
            return 1.0
        if self.status != "telemetry":
            self.status = "telemetry"
            log.info("latency model: GPU clock readings usable again")
        return ref / float(clock)  # type: ignore[arg-type]

    def _refuse(self, clock: Any) -> None:
        self.telemetry_ignored += 1
        reason = "no clock reading" if clock is None else f"clock reading {clock!r} unusable"
        self.status = f"prior: {reason}"
        if not self._said:
            self._said = True
            log.warning(
                "latency model: %s; planning with the profiled clock (said once, counted in "
                "telemetry_ignored)",
                reason,
            )

    # -- learning and predicting ----------------------------------------------------------------

    def learn_one(
        self, x: Mapping[str, Any], tpot_s: float | None, *, now: float | None = None
    ) -> None:
        if not _usable(tpot_s, self.max_step_s) or tpot_s == 0:
            return
        running = x.get("running", 1)
        n = float(running) if _usable(running, math.inf) else 1.0
        clock = self.clock_factor(x)
        step = self.prior.step(n) * clock
        if step <= 0:
            return
        prefill, steps = x.get("prefill_tokens"), x.get("decode_steps")
        told = _usable(prefill, math.inf) and _usable(steps, math.inf) and steps >= 1
        # told: the prefill this request decoded beside, at the prior's cost and today's clock
        expected = step + prefill * self.prior.prefill_s_per_token * clock / steps if told else step
        trust = self.trust(now)
        self.residual = self._fold(self.residual, math.log(tpot_s / expected), trust)
        if told:
            self.interference = self._fold(self.interference, math.log(expected / step), trust)
        self.learned += 1
        if now is not None:
            self.learned_at = now

    @staticmethod
    def _fold(mean: stats.EWMean, seen: float, trust: float) -> stats.EWMean:
        """``mean`` updated with ``seen``, after what it holds has faded to ``trust``: what is
        still believed weighs as ``trust`` times the mean's memory (1 / alpha outcomes), so
        after a long silence one outcome says most of what is known."""
        if trust >= 1.0:
            mean.update(seen)
            return mean
        memory = trust / mean.fading_factor
        faded = stats.EWMean(mean.fading_factor)
        faded.update((memory * trust * mean.get() + seen) / (memory + 1))
        return faded

    def trust(self, now: float | None) -> float:
        """The weight of what was learned at ``now``: 1 up to ``forget_after_s`` after the last
        outcome, then halving every ``half_life_s``."""
        if now is None or self.learned_at is None:
            return 1.0
        idle = now - self.learned_at - self.forget_after_s
        return 1.0 if idle <= 0 else 0.5 ** (idle / self.half_life_s)

    def _learned(self, mean: stats.EWMean, now: float | None) -> float:
        return mean.get() * self.trust(now) if self.learned >= self.warmup else 0.0

    def speed(self, x: Mapping[str, Any], now: float | None = None) -> float:
        """How many times the prior's step time the GPU takes now, prefill interference aside:
        the clock and the speed residual."""
        return self.clock_factor(x) * math.exp(min(max(self._learned(self.residual, now), -5), 5))

    def factor(self, x: Mapping[str, Any], now: float | None = None) -> float:
        """How many times the prior's step time a step takes now, prefill interference
        included."""
        learned = self._learned(self.residual, now) + self._learned(self.interference, now)
        return self.clock_factor(x) * math.exp(min(max(learned, -5.0), 5.0))

    def coefficients(self, x: Mapping[str, Any], now: float | None = None) -> StepCoefficients:
        c = self.prior.scaled(self.factor(x, now))
        return StepCoefficients(
            min(c.base_s, self.max_step_s), min(c.per_seq_s, self.max_step_s), c.prefill_s_per_token
        )

    def predict_one(self, x: Mapping[str, Any], now: float | None = None) -> float:
        running = x.get("running", 1)
        n = float(running) if _usable(running, math.inf) else 1.0
        return self.coefficients(x, now).step(n)

    def adopt(self, saved: Any, now: float | None = None) -> bool:
        """Take over what ``saved`` (a checkpointed model) learned, keeping this one's prior and
        clock (the settings may have changed), as if learned at ``now`` (the old process's times
        mean nothing here); False when it is not a model of this kind."""
        residual = getattr(saved, "residual", None)
        learned = getattr(saved, "learned", None)
        if not isinstance(residual, stats.EWMean) or not isinstance(learned, int):
            return False
        self.residual, self.learned, self.learned_at = residual, learned, now
        interference = getattr(saved, "interference", None)  # absent in older checkpoints
        if isinstance(interference, stats.EWMean):
            self.interference = interference
        return True

    def state(self, now: float | None = None) -> dict[str, Any]:
        """For ``/admin/state``: where its numbers come from, learned against profiled."""
        trust = self.trust(now) if self.learned else 0.0
        speed, interference = self.residual.get() * trust, self.interference.get() * trust
        return {
            "status": self.status,
            "learned": self.learned,
            "telemetry_ignored": self.telemetry_ignored,
            "profiled_step_s": self.prior.step(1),
            "learned_factor": round(math.exp(speed + interference), 4),
            "speed_factor": round(math.exp(speed), 4),
            "interference_factor": round(math.exp(interference), 4),
            "trust": round(self.trust(now), 4),
        }


def _usable(value: Any, upper: float) -> bool:
    return (
        isinstance(value, int | float)
        and not isinstance(value, bool)
        and math.isfinite(value)
        and 0 <= value <= upper
    )
