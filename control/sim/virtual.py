"""Virtual time: a cluster of simulated instances driven from event to event, for benchmarks."""

from __future__ import annotations

import heapq
import itertools
import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Protocol

from steersman.control.sim.engine import Plan, SimEngine, SimRequest

RUN_HORIZON_S = 0.5

# A dispatch policy: (the arriving request, the engines, now) -> index of the chosen engine.
Dispatch = Callable[[SimRequest, Sequence[SimEngine], float], int]


class Router(Protocol):
    """Routers that hold requests back (a queue in front of the engines) decide at arrivals and
    at completions; each returns the (engine index, request) pairs to send now."""

    def arrive(
        self, req: SimRequest, engines: Sequence[SimEngine], now: float
    ) -> Iterable[tuple[int, SimRequest]]: ...

    def finished(
        self, done: list[SimRequest], engines: Sequence[SimEngine], now: float
    ) -> Iterable[tuple[int, SimRequest]]: ...


class Immediate:
    """A router that dispatches every request on arrival (what plain load balancers do)."""

    def __init__(self, dispatch: Dispatch) -> None:
        self.dispatch = dispatch

    def arrive(
        self, req: SimRequest, engines: Sequence[SimEngine], now: float
    ) -> Iterable[tuple[int, SimRequest]]:
        return ((self.dispatch(req, engines, now), req),)

    def finished(
        self, done: list[SimRequest], engines: Sequence[SimEngine], now: float
    ) -> Iterable[tuple[int, SimRequest]]:
        return ()


def round_robin() -> Dispatch:
    counter = itertools.count()
    return lambda req, engines, now: next(counter) % len(engines)


@dataclass
class ClusterRun:
    finished: list[SimRequest]
    engines: list[SimEngine]
    end: float
    events: int


def run_cluster(
    arrivals: Sequence[SimRequest], engines: list[SimEngine], dispatch: Dispatch | Router
) -> ClusterRun:
    """Dispatch each request at its arrival time and run every engine until all are done.

    ``arrivals`` must be sorted by ``arrival``. An engine step that ends at the same instant as
    an arrival completes first. Engines take runs of decode steps in one go until their own next
    event; a request joining an engine mid-run cuts the run at the step in progress, where vLLM
    would admit it. The dispatcher sees an engine mid-run as it was when the run began (who runs
    and who waits are exact: nobody joins or leaves during a run).
    """
    router = dispatch if hasattr(dispatch, "arrive") else Immediate(dispatch)  # type: ignore[arg-type]
    steps: list[tuple[float, int, int, Plan, float]] = []
    busy = [False] * len(engines)
    current: dict[int, tuple[int, Plan, float]] = {}  # engine -> (heap entry id, plan, began)
    seq = itertools.count()
    finished: list[SimRequest] = []
    events = 0
    now = 0.0
    i = 0

    def start(k: int, now: float) -> None:
        engine = engines[k]
        if not engine.has_work():
            busy[k] = False
            return
        # A GPU's speed can change (a throttle): runs end within a period, to be planned anew.
        horizon = RUN_HORIZON_S if engine.gpu is not None else math.inf
        plan = engine.plan_decode_run(horizon, now) or engine.plan(now)
        if plan is None:
            busy[k] = False  # nothing fits until something else finishes
            return
        busy[k] = True
        entry = next(seq)
        current[k] = (entry, plan, now)
        heapq.heappush(steps, (now + plan.duration, entry, k, plan, now))

    # Requests on their way through an API server (admission_s) before reaching an engine.
    pending: list[tuple[float, int, int, SimRequest]] = []
    cancelled: set[int] = set()  # heap entries of runs that were cut short

    def enqueue(k: int, req: SimRequest, now: float) -> None:
        req.queued_at = now
        engines[k].add(req)
        if not busy[k]:
            start(k, now)
            return
        entry, plan, began = current[k]
        if plan.run:  # cut the run after the step in progress, so the newcomer gets admitted
            keep = min(plan.steps, plan.steps_done_by(now - began) + 1)
            if keep < plan.steps:
                cancelled.add(entry)
                cut = plan.truncated(keep)
                new_entry = next(seq)
                current[k] = (new_entry, cut, began)
                heapq.heappush(steps, (began + cut.duration, new_entry, k, cut, began))

    def send(decisions: Iterable[tuple[int, SimRequest]], now: float) -> None:
        for k, req in decisions:
            delay = engines[k].model.admission(busy[k])
            if delay > 0:
                heapq.heappush(pending, (now + delay, next(seq), k, req))
            else:
                enqueue(k, req, now)

    while i < len(arrivals) or steps or pending:
        next_arrival = arrivals[i].arrival if i < len(arrivals) else math.inf
        next_pending = pending[0][0] if pending else math.inf
        if next_pending <= next_arrival and (not steps or next_pending < steps[0][0]):
            now, _, k, req = heapq.heappop(pending)
            enqueue(k, req, now)
        elif steps and steps[0][0] <= next_arrival:
            end, entry, k, plan, began = heapq.heappop(steps)
            if entry in cancelled:
                cancelled.discard(entry)
                continue
            now = end
            engine = engines[k]
            done = engine.finish_decode_run(plan, began) if plan.run else engine.finish(plan, end)
            finished.extend(done)
            start(k, now)
            if done:
                send(router.finished(done, engines, now), now)
        else:
            now = next_arrival
            req = arrivals[i]
            i += 1
            send(router.arrive(req, engines, now), now)
        events += 1
    return ClusterRun(finished, engines, now, events)
