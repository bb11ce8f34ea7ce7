"""One scheduling core: the daemon's shell and the simulator's virtual-time driver, fed the same
arrivals and outcomes, make the same decisions (which request goes where, when, with what
priority and scheduled length), because both only translate events into calls of one core."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

from steersman.control.backends.base import GenerationRequest, GenerationResult, StreamEvent
from steersman.control.core.scheduler import Assignment, Scheduler
from steersman.control.core.settings import ControllerSettings, DispatchSettings
from steersman.control.serve.instances import Instance
from steersman.control.serve.metrics import Metrics
from steersman.control.serve.predictor import Predictor
from steersman.control.serve.service import Steersman
from steersman.control.serve.settings import load_settings
from steersman.control.sim.driver import CoreDriver
from steersman.control.sim.engine import SimRequest
from steersman.control.sim.profiles import StepModel, load_profile
from steersman.learners.batching import MicroBatcher
from steersman.learners.corrector import BASE_KEY
from steersman.learners.latency import LatencyModel, StepCoefficients

STEP = StepCoefficients(0.01, 0.0005, 0.0)
# Priorities by length everywhere, so that they carry what each shell predicted.
DISPATCH = DispatchSettings(policy="predictive", aging_s=2.0, engine_order="always")
CONTROLLER = ControllerSettings(miss_streak=3, fallback_s=4.0, adjust_every=3, window=6)

# (time, "arrive", request, its true length) and (time, "finish", instance): twelve requests on
# two instances of one slot each, so most wait and the order of the queue decides; whatever runs
# on the named instance finishes then (no timing model chooses), and enough predictions miss to
# send the controller into FALLBACK and back.
_lengths = [40, 5, 300, 12, 80, 7, 150, 3, 60, 22, 500, 9]
SCRIPT: list[tuple] = [(0.3 * k, "arrive", f"r{k}", n) for k, n in enumerate(_lengths)]
SCRIPT += [(0.2 + 0.7 * j, "finish", str(j % 2)) for j in range(40)]
SCRIPT.sort(key=lambda e: (e[0], e[1] == "arrive"))  # at one instant, a finish comes first


def base_of(rid: str) -> float:
    """The base model's prediction of a request: deterministic, unrelated to its truth."""
    return 20.0 + 37.0 * (int(rid[1:]) % 5)


class Recording(Scheduler):
    """The core as is, keeping what each ``schedule`` call decided."""

    def __init__(self) -> None:
        super().__init__(DISPATCH, CONTROLLER)
        self.decided: list[tuple[float, Assignment]] = []

    def schedule(self, instances, now):
        out = super().schedule(instances, now)
        self.decided.extend((now, a) for a in out)
        return out


def decisions(core: Recording) -> list[tuple]:
    return [
        (round(t, 6), a.request_id, a.instance, a.priority, round(a.scheduled, 6), a.policy, a.mode)
        for t, a in core.decided
    ]


# -- the simulator's driver ------------------------------------------------------------------


@dataclass
class StubEngine:
    """What the driver reads of an engine: its profile (a KV cache far larger than this script
    needs), an empty KV cache and queue, and no running request with progress to report (a
    request here produces all its tokens at the instant it finishes)."""

    model: StepModel = field(default_factory=lambda: load_profile("cpu-tiny"))
    waiting: int = 0
    running: list[SimRequest] = field(default_factory=list)
    policy: str = "priority"  # vLLM's built-in priority policy

    def kv_usage(self) -> float | None:
        return 0.0


def drive_virtual() -> Recording:
    core = Recording()
    features = {f"r{k}": {BASE_KEY: base_of(f"r{k}")} for k in range(len(_lengths))}
    driver = CoreDriver(core, STEP, features=features, cap=1)
    engines = [StubEngine(), StubEngine()]
    requests: dict[str, SimRequest] = {}
    for event in SCRIPT:
        t, kind, rid = event[:3]  # rid: the instance, for a finish
        if kind == "arrive":
            requests[rid] = SimRequest(rid, t, 0, event[3])
            driver.arrive(requests[rid], engines, t)  # type: ignore[arg-type]
        else:
            for running in core.running(rid):
                req = requests[running]
                req.generated = req.output_tokens
                driver.finished([req], engines, t)  # type: ignore[arg-type]
    return core


# -- the daemon's shell ------------------------------------------------------------------------


@dataclass
class Clock:
    now: float = 0.0

    def __call__(self) -> float:
        return self.now


@dataclass
class ScriptedBackend:
    """An instance whose requests end when the script says, with all their tokens at once."""

    name: str
    clock: Clock
    release: dict[str, asyncio.Event] = field(default_factory=dict)

    async def stream(
        self, request: GenerationRequest, result: GenerationResult
    ) -> AsyncIterator[StreamEvent]:
        gate = self.release.setdefault(request.request_id, asyncio.Event())
        await gate.wait()
        n = int(request.body["max_tokens"])
        data = {
            "choices": [{"index": 0, "text": " x" * n, "finish_reason": "length"}],
            "usage": {"prompt_tokens": 0, "completion_tokens": n, "total_tokens": n},
        }
        result.account(data, self.clock())
        result.finished_at = self.clock()
        yield StreamEvent(self.clock(), data)

    async def health(self) -> bool:
        return True

    async def models(self) -> list[dict]:
        return [{"id": "m"}]

    async def aclose(self) -> None:
        return None


def drive_daemon() -> Recording:
    async def main() -> Recording:
        clock = Clock()
        core = Recording()
        batcher = MicroBatcher(lambda texts: [base_of(t) for t in texts], max_wait_s=0)
        backends = [ScriptedBackend(name, clock) for name in ("0", "1")]
        instances = [
            Instance(b.name, b, LatencyModel(STEP, warmup=10**9), cap=1)  # type: ignore[arg-type]
            for b in backends
        ]
        settings = load_settings(None, {"predictor": {"max_tokens_is_length": True}}, environ={})
        svc = Steersman(
            instances,
            Predictor(batcher, deadline_s=60.0),
            core,
            settings,
            record=lambda table, row: None,
            metrics=Metrics(),
            clock=clock,
        )
        tasks: dict[str, asyncio.Task] = {}

        async def serve(rid: str, n: int) -> None:
            job = await svc.prepare(
                rid, "completion", {"model": "m", "prompt": rid, "max_tokens": n}
            )
            async for _ in svc.run(job):
                pass

        try:
            for event in SCRIPT:
                t, kind, rid = event[:3]  # rid: the instance, for a finish
                clock.now = t
                if kind == "arrive":
                    tasks[rid] = asyncio.create_task(serve(rid, event[3]))
                    while core.scheduled(rid) is None:  # until the core has it
                        await asyncio.sleep(0)
                    for _ in range(5):  # and a granted request has reached its instance
                        await asyncio.sleep(0)
                else:
                    for running in core.running(rid):
                        backend = backends[int(rid)]
                        while running not in backend.release:  # until it streams
                            await asyncio.sleep(0)
                        backend.release[running].set()
                        await tasks.pop(running)
        finally:
            batcher.close()
        return core

    return asyncio.run(main())


def test_the_daemon_and_the_virtual_time_driver_decide_alike():
    virtual, daemon = drive_virtual(), drive_daemon()
    assert len(virtual.decided) == len(_lengths)
    assert decisions(daemon) == decisions(virtual)
    # The scenario exercises what it claims: a queue, both instances, and the controller.
    assert {a.instance for _, a in virtual.decided} == {"0", "1"}
    assert sum(t > 0.3 * int(a.request_id[1:]) for t, a in virtual.decided) > 5  # waited
    assert {a.mode for _, a in virtual.decided} == {"NORMAL", "FALLBACK"}
    assert virtual.stats.fallbacks == daemon.stats.fallbacks >= 1
