"""A simulated GPU under a simulated engine: SM activity from the engine's busy time, a
temperature that rises with load and falls when idle, an SM clock that throttles above a
temperature or on command, and the factor by which that slows the engine's steps. It reports
NVML-shaped readings (``GpuReading``) through the sampler's ``GpuSource`` protocol, so the
latency model learns from the same path whether the GPU is real or simulated.

The thermal model is first order: at power ``P`` the die settles at ``ambient + r * P`` with
time constant ``tau_s``; power is idle power plus the rest of the board's TDP times SM activity
times the clock's share of boost. Above ``slowdown_c`` the driver lowers the clock linearly, to
``min_clock`` at ``slowdown_c + slowdown_span_c`` (HW slowdown starts at about 83 C on A100 and
H100 and takes 100-200 MHz at 85 C, 500+ MHz near 90 C; NVIDIA: "the driver will throttle down
performance to bring temperature back underneath the maximum"). A step's time scales with
``boost / clock``: the simulated engine's steps are treated as bound by the SM clock (decode is
partly memory-bound on real GPUs, where a throttle costs less than this). Boost clocks and board
power are NVIDIA's data-sheet figures; ``r`` is chosen so that a fully busy board settles at
about 70 C in 25 C air, and ``tau_s`` = 30 s is a heatsink's time constant.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Protocol

from steersman.control.sim.profiles import StepModel
from steersman.telemetry.readings import GpuReading, SourceStatus


@dataclass(frozen=True)
class GpuSpec:
    name: str
    boost_mhz: float
    tdp_w: float
    idle_w: float
    min_clock: float = 0.4  # the lowest share of boost a thermal slowdown goes to
    slowdown_c: float = 83.0
    slowdown_span_c: float = 7.0
    ambient_c: float = 25.0
    settle_c: float = 70.0  # where a fully busy board settles with healthy cooling
    tau_s: float = 30.0

    @property
    def r_c_per_w(self) -> float:
        return (self.settle_c - self.ambient_c) / self.tdp_w


# Boost clock and board power from NVIDIA's data sheets; idle power about a seventh of TDP.
GPU_SPECS: dict[str, GpuSpec] = {
    "a100": GpuSpec("a100", boost_mhz=1410, tdp_w=400, idle_w=55),  # A100 SXM4 80 GB
    "h100": GpuSpec("h100", boost_mhz=1980, tdp_w=700, idle_w=70),  # H100 SXM5
    "h200": GpuSpec("h200", boost_mhz=1980, tdp_w=700, idle_w=70),  # H200 SXM
    "a30": GpuSpec("a30", boost_mhz=1440, tdp_w=165, idle_w=30),
    "l4": GpuSpec("l4", boost_mhz=2040, tdp_w=72, idle_w=16),
    "a10": GpuSpec("a10", boost_mhz=1695, tdp_w=150, idle_w=25),
    "l40s": GpuSpec("l40s", boost_mhz=2520, tdp_w=350, idle_w=35),
}


def spec_for(profile_name: str) -> GpuSpec:
    """The GPU of a step-time profile, by the profile's name ("a30-llama2-7b": the A30); a
    profile of no known GPU (a calibrated CPU one) gets the A100's figures."""
    return GPU_SPECS.get(profile_name.split("-", 1)[0], GPU_SPECS["a100"])


def reference_clock_mhz(profile: StepModel) -> float:
    """The SM clock at which a real GPU runs the profile's step times: a real GPU's latency model
    scales them by this over the clock it reads. A calibrated profile's measured clock (a busy
    GPU often holds well below boost, bound by power), else its GPU's boost clock. (The
    simulator's GPUs hold boost while healthy, so its latency models scale from boost.)

    >>> from steersman.control.sim.profiles import PROFILES
    >>> from dataclasses import replace
    >>> a100 = PROFILES["a100-llama2-7b"]
    >>> reference_clock_mhz(a100), reference_clock_mhz(replace(a100, clock_mhz=1275.0))
    (1410, 1275.0)
    """
    return profile.clock_mhz or spec_for(profile.name).boost_mhz


@dataclass(frozen=True)
class GpuEvent:
    """From ``at_s`` on: the clock capped at ``clock_cap`` of boost (``nvidia-smi -lgc``, a power
    cap), another tenant taking ``contention`` of the SMs (a noisy neighbour: steps take
    ``1 + contention`` times as long), cooling ``cooling`` times as good (0.5: a failing fan).
    A field left None keeps its value."""

    at_s: float
    clock_cap: float | None = None
    contention: float | None = None
    cooling: float | None = None


@dataclass
class SimGpu:
    """One GPU's state, advanced lazily to the time it is asked about.

    >>> g = SimGpu(GPU_SPECS["a100"], events=[GpuEvent(10.0, clock_cap=0.6)])
    >>> g.advance(5.0, busy_s=5.0); round(g.slowdown, 3)
    1.0
    >>> g.advance(11.0, busy_s=11.0); round(g.slowdown, 3), round(g.clock_mhz)
    (1.667, 846)
    """

    spec: GpuSpec
    events: list[GpuEvent] = field(default_factory=list)
    index: int = 0
    temperature_c: float = math.nan  # ambient until first advanced
    clock_cap: float = 1.0
    contention: float = 0.0
    cooling: float = 1.0
    sm_activity: float = 0.0  # over the last interval advanced
    clock_mhz: float = 0.0
    _t: float = 0.0
    _busy: float = 0.0
    _next: int = 0

    def __post_init__(self) -> None:
        self.events = sorted(self.events, key=lambda e: e.at_s)
        if math.isnan(self.temperature_c):
            self.temperature_c = self.spec.ambient_c
        self.clock_mhz = self.spec.boost_mhz * self._clock_share()

    def advance(self, now: float, busy_s: float) -> None:
        """Bring the state to ``now``; ``busy_s``: the engine's busy seconds so far."""
        if now <= self._t:
            return
        start, busy0 = self._t, self._busy
        while self._next < len(self.events) and self.events[self._next].at_s <= now:
            event = self.events[self._next]
            # The busy time since the last call, spread evenly over it.
            share = max(event.at_s - start, 0.0) / (now - start)
            self._integrate(event.at_s, busy0 + (busy_s - busy0) * share)
            self.clock_cap = event.clock_cap if event.clock_cap is not None else self.clock_cap
            self.contention = event.contention if event.contention is not None else self.contention
            self.cooling = event.cooling if event.cooling is not None else self.cooling
            self._next += 1
        self._integrate(now, busy_s)
        self.clock_mhz = self.spec.boost_mhz * self._clock_share()

    def _integrate(self, until: float, busy_s: float) -> None:
        dt = until - self._t
        if dt <= 0:
            return
        s = self.spec
        activity = min(max((busy_s - self._busy) / dt, 0.0), 1.0)
        share = self._clock_share()
        power = s.idle_w + (s.tdp_w - s.idle_w) * activity * share
        settle = s.ambient_c + s.r_c_per_w / max(self.cooling, 1e-3) * power
        self.temperature_c = settle + (self.temperature_c - settle) * math.exp(-dt / s.tau_s)
        self.sm_activity = min(1.0, activity + self.contention)
        self._t, self._busy = until, busy_s

    def _clock_share(self) -> float:
        s = self.spec
        over = (self.temperature_c - s.slowdown_c) / s.slowdown_span_c
        thermal = 1.0 - (1.0 - s.min_clock) * min(max(over, 0.0), 1.0)
        return max(min(thermal, self.clock_cap), s.min_clock * 0.5)

    @property
    def slowdown(self) -> float:
        """How many times longer a step takes than at boost clock with the GPU to itself."""
        return self.spec.boost_mhz / self.clock_mhz * (1.0 + self.contention)

    @property
    def throttled(self) -> bool:
        return self.clock_mhz < self.spec.boost_mhz - 1e-6

    def reading(self, wall: float) -> GpuReading:
        # NVML's clocks-event reasons: 0x4 SW power cap, 0x20 SW thermal slowdown.
        thermal = self.temperature_c > self.spec.slowdown_c
        reasons = (0x20 if thermal else 0) | (0x4 if self.clock_cap < 1.0 else 0)
        return GpuReading(
            ts=wall,
            gpu_index=self.index,
            uuid=f"GPU-sim-{self.spec.name}-{self.index}",
            method="gpm",
            sm_activity=self.sm_activity,
            temperature_c=round(self.temperature_c, 2),
            sm_clock_mhz=round(self.clock_mhz, 1),
            power_w=None,
            throttle_reasons=reasons,
        )


class Busy(Protocol):
    """What a GPU is under: something that knows its busy time (a ``SimEngine``)."""

    gpu: SimGpu | None

    def busy_s(self) -> float: ...


class SimGpuSource:
    """The sampler's ``GpuSource`` over simulated engines' GPUs: GPU ``k`` is engine ``k``'s."""

    def __init__(self, engines: list[Busy]) -> None:
        self.engines = engines
        self.status = SourceStatus(False, "not opened")

    def open(self) -> SourceStatus:
        n = sum(1 for e in self.engines if e.gpu is not None)
        self.status = SourceStatus(n > 0, "" if n else "no simulated GPUs", gpus=n)
        return self.status

    def sample(self, mono: float, wall: float) -> list[GpuReading]:
        out = []
        for engine in self.engines:
            gpu = engine.gpu
            if gpu is not None:
                gpu.advance(mono, engine.busy_s())
                out.append(gpu.reading(wall))
        return out

    def close(self) -> None:
        self.status = SourceStatus(False, "closed")
