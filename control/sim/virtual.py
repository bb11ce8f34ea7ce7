"""Virtual time: a cluster of simulated instances driven from event to event, for benchmarks."""

from __future__ import annotations

import heapq
import itertools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from steersman.control.sim.engine import Plan, SimEngine, SimRequest

# A dispatch policy: (the arriving request, the engines, now) -> index of the chosen engine.
Dispatch = Callable[[SimRequest, Sequence[SimEngine], float], int]


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
    arrivals: Sequence[SimRequest], engines: list[SimEngine], dispatch: Dispatch
) -> ClusterRun:
    """Dispatch each request at its arrival time and run every engine until all are done.

    ``arrivals`` must be sorted by ``arrival``. An engine step that ends at the same instant as
    an arrival completes first, so the dispatcher sees the engines' state at that instant.
    """
    steps: list[tuple[float, int, int, Plan, float]] = []
    busy = [False] * len(engines)
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
        upcoming = min(
            arrivals[i].arrival if i < len(arrivals) else math.inf,
            pending[0][0] if pending else math.inf,
        )
        horizon = upcoming - now
        plan = engine.plan_decode_run(horizon) or engine.plan()
        if plan is None:
            busy[k] = False  # nothing fits until something else finishes
            return
        busy[k] = True
        heapq.heappush(steps, (now + plan.duration, next(seq), k, plan, now))

    # Requests on their way through an API server (admission_s) before reaching an engine.
    pending: list[tuple[float, int, int, SimRequest]] = []

    def enqueue(k: int, req: SimRequest, now: float) -> None:
        engines[k].add(req)
        if not busy[k]:
            start(k, now)

    while i < len(arrivals) or steps or pending:
        next_arrival = arrivals[i].arrival if i < len(arrivals) else math.inf
        next_pending = pending[0][0] if pending else math.inf
        if next_pending <= next_arrival and (not steps or next_pending < steps[0][0]):
            now, _, k, req = heapq.heappop(pending)
            enqueue(k, req, now)
        elif steps and steps[0][0] <= next_arrival:
            end, _, k, plan, began = heapq.heappop(steps)
            now = end
            engine = engines[k]
            done = (
                engine.finish_decode_run(plan, began)
                if plan.steps > 1
                else engine.finish(plan, end)
            )
            finished.extend(done)
            start(k, now)
        else:
            now = next_arrival
            req = arrivals[i]
            i += 1
            k = dispatch(req, engines, now)
            delay = engines[k].model.admission_s
            if delay > 0:
                heapq.heappush(pending, (now + delay, next(seq), k, req))
            else:
                enqueue(k, req, now)
        events += 1
    return ClusterRun(finished, engines, now, events)
