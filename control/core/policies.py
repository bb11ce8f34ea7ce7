"""Dispatch policies: pure functions of instance views, the request and time.

A policy is ``policy(ctx) -> Decision``; the scheduler builds the context and carries the
decision out. Only instances that are healthy, below their cap and with room are chosen.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np


@dataclass(slots=True)  # not frozen: built many times a decision, and 6x cheaper this way
class InstanceView:
    """One instance as a policy sees it at decision time.

    ``remaining`` holds the predicted remaining output tokens of each request steersman has in
    flight there; ``prefill_backlog`` the prompt tokens of those that have not produced a token
    yet (their prefill is ahead of a newcomer's); ``step_s(n)`` = ``step_base_s +
    step_per_seq_s * n`` is the latency model's decode step time with ``n`` running sequences;
    ``prefill_s_per_token`` its prefill cost.
    """

    name: str
    in_flight: int = 0
    cap: int = 1 << 30
    healthy: bool = True
    kv_usage: float | None = None
    waiting: int = 0
    remaining: Sequence[float] = ()
    step_base_s: float = 0.01
    step_per_seq_s: float = 0.0005
    prefill_s_per_token: float = 0.0001
    prefill_backlog: float = 0.0

    room: bool = True  # the scheduler's admission lets this request in here
    cached_tokens: int = 0  # of this request's prompt, what the instance likely holds cached

    @property
    def free(self) -> bool:
        return self.healthy and self.room and self.in_flight < self.cap


@dataclass(slots=True)
class DispatchContext:
    instances: Sequence[InstanceView]
    request_id: str
    predicted_tokens: float
    prompt_tokens: int
    now: float
    counter: int = 0  # dispatches so far, for round-robin
    true_tokens: int | None = None  # the oracle's input; benchmarks only
    impact_weight: float = 1.0
    ttft_weight: float = 1.0  # predictive: the weight of the prefills ahead of a first token
    load_margin: float = math.inf  # predictive: only instances this close to the lowest load
    # Per instance, sum(min(remaining, length)): the scheduler passes it vectorised over every
    # request in flight; without it, it is computed from each view's ``remaining``.
    shared: Callable[[float], Sequence[float]] | None = None

    def shared_tokens(self, length: float) -> Sequence[float]:
        if self.shared is not None:
            return self.shared(length)
        return [_shared(v.remaining, length) for v in self.instances]


@dataclass(frozen=True)
class Decision:
    instance: str | None  # None: nothing can take the request now
    policy: str
    scores: dict[str, float] = field(default_factory=dict)


Policy = Callable[[DispatchContext], Decision]


def _free(ctx: DispatchContext) -> list[InstanceView]:
    return [v for v in ctx.instances if v.free]


def round_robin(ctx: DispatchContext) -> Decision:
    """The next free instance after the ``counter``-th, in configuration order."""
    n = len(ctx.instances)
    for k in range(n):
        view = ctx.instances[(ctx.counter + k) % n]
        if view.free:
            return Decision(view.name, "round-robin")
    return Decision(None, "round-robin")


def random_choice(ctx: DispatchContext) -> Decision:
    """A free instance at random, seeded by the request id (the same request, the same pick)."""
    free = _free(ctx)
    if not free:
        return Decision(None, "random")
    return Decision(random.Random(ctx.request_id).choice(free).name, "random")


def least_load(ctx: DispatchContext) -> Decision:
    """Llumnix-style: the lowest load, where load is KV-cache usage plus the share of the cap in
    use, plus queued requests; ties go to configuration order."""
    scores = {v.name: _load(v) for v in _free(ctx)}
    return _lowest(scores, "least-load")


def _slots(view: InstanceView) -> int:
    return view.cap if view.cap < 1 << 30 else 64


def _load(view: InstanceView) -> float:
    kv = view.kv_usage if view.kv_usage is not None and math.isfinite(view.kv_usage) else 0.0
    return kv + view.in_flight / _slots(view) + view.waiting


def prefix_affinity(ctx: DispatchContext) -> Decision:
    """vLLM production-stack style: the instance likely to hold the longest prefix of the
    prompt; ties by least load (so that prompts with nothing cached spread out)."""
    scores = {v.name: _load(v) - 1000.0 * v.cached_tokens for v in _free(ctx)}
    return _lowest(scores, "prefix-affinity")


def predictive(ctx: DispatchContext) -> Decision:
    """Block-style: roll each instance's batch forward with predicted remaining lengths and its
    latency model; score = the new request's predicted latency plus (``impact_weight`` times) the
    delay it adds to the requests already there, its prefill charged, to it and to each of them,
    only for what the instance likely does not hold cached, and (``ttft_weight`` times) the
    prefills still ahead of it there (its first token waits for them). The lowest score wins:
    affinity is weighed against load and decode time in one cost, so a hot prefix does not pile
    everything on one instance. Only instances whose ``least-load`` load is within
    ``load_margin`` of the lowest compete: the roll-forward knows decode time, not memory, and
    predictions are noisy, so an instance whose KV cache is full or whose engine queues is never
    picked over one with room.

    >>> a = InstanceView("a", in_flight=1, kv_usage=0.9, remaining=(5.0,))
    >>> b = InstanceView("b", in_flight=3, kv_usage=0.2, remaining=(400.0, 400.0, 400.0))
    >>> predictive(DispatchContext([a, b], "r", 100.0, 10, 0.0)).instance  # fewer steps shared
    'a'
    >>> predictive(DispatchContext([a, b], "r", 100.0, 10, 0.0, load_margin=0.1)).instance
    'b'
    """
    return _lowest(_costs(ctx, max(ctx.predicted_tokens, 1.0)), "predictive")


def oracle(ctx: DispatchContext) -> Decision:
    """``predictive`` with the true output length: the bound a perfect predictor would reach."""
    length = float(ctx.true_tokens if ctx.true_tokens is not None else ctx.predicted_tokens)
    return _lowest(_costs(ctx, max(length, 1.0)), "oracle")


def _costs(ctx: DispatchContext, length: float) -> dict[str, float]:
    """``rollout``'s own latency plus weighted delay, per free instance (written out: this runs
    for every instance at every decision)."""
    shared = ctx.shared_tokens(length)
    weight = 1.0 + ctx.impact_weight
    free = [v.free for v in ctx.instances]
    loads = [_load(v) if ok else math.inf for v, ok in zip(ctx.instances, free, strict=True)]
    bound = min(loads, default=math.inf) + ctx.load_margin
    scores = {}
    for view, steps, ok, load in zip(ctx.instances, shared, free, loads, strict=True):
        # One request more than the least loaded always competes: where an instance has few
        # slots, one request is a large share, and the guard must not become least-load.
        if ok and load - 1.0 / _slots(view) <= bound:
            per_seq = view.step_per_seq_s
            # The uncached prefill delays the newcomer, and every request decoding beside it.
            prefill = max(ctx.prompt_tokens - view.cached_tokens, 1) * view.prefill_s_per_token
            scores[view.name] = (
                (prefill + ctx.ttft_weight * view.prefill_backlog * view.prefill_s_per_token)
                + prefill * ctx.impact_weight * view.in_flight
                + length * (view.step_base_s + per_seq)
                + weight * per_seq * float(steps)
            )
    return scores


def rollout(
    view: InstanceView, length: float, prompt_tokens: int, shared: float | None = None
) -> tuple[float, float]:
    """(latency of a new request of ``length`` output tokens, total delay it adds to the others).

    At the newcomer's k-th decode step the batch holds it and every request with more than k
    tokens left; a step with n sequences takes ``step_base_s + step_per_seq_s * n``. Summed over
    its ``length`` steps, each running request i shares ``min(r_i, length)`` of them, and each
    shared step slows that request by one ``step_per_seq_s``.

    >>> v = InstanceView("a", remaining=(10.0,), step_base_s=0.01, step_per_seq_s=0.001)
    >>> own, delay = rollout(v, 20, 0)
    >>> round(own, 4), round(delay, 4)  # 10 steps with 2 sequences, then 10 alone
    (0.23, 0.01)
    """
    if shared is None:
        shared = _shared(view.remaining, length)
    per_seq = view.step_per_seq_s
    own = (
        prompt_tokens * view.prefill_s_per_token
        + length * (view.step_base_s + per_seq)
        + per_seq * shared
    )
    return own, per_seq * shared


def _shared(remaining: Sequence[float], length: float) -> float:
    return float(np.minimum(remaining, length).sum()) if len(remaining) else 0.0


def _lowest(scores: dict[str, float], policy: str) -> Decision:
    if not scores:
        return Decision(None, policy)
    best = min(scores, key=lambda name: scores[name])  # first of equals: configuration order
    return Decision(best, policy, scores)


POLICIES: dict[str, Policy] = {
    "predictive": predictive,
    "least-load": least_load,
    "round-robin": round_robin,
    "prefix-affinity": prefix_affinity,
    "random": random_choice,
    "oracle": oracle,
}
