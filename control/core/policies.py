"""Dispatch policies and request priority: pure functions of instance views, the request and time.

A policy is ``policy(ctx) -> Decision``; the scheduling loop builds the context and carries the
decision out. Only instances that are healthy and below their concurrency cap are offered.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field


@dataclass(frozen=True)
class InstanceView:
    """One instance as a policy sees it at decision time.

    ``remaining`` holds the predicted remaining output tokens of each request steersman has in
    flight there; ``step_s(n)`` = ``step_base_s + step_per_seq_s * n`` is the latency model's
    decode step time with ``n`` running sequences; ``prefill_s_per_token`` its prefill cost.
    """

    name: str
    in_flight: int = 0
    cap: int = 1 << 30
    healthy: bool = True
    kv_usage: float | None = None
    waiting: int = 0
    remaining: tuple[float, ...] = ()
    step_base_s: float = 0.01
    step_per_seq_s: float = 0.0005
    prefill_s_per_token: float = 0.0001

    @property
    def free(self) -> bool:
        return self.healthy and self.in_flight < self.cap


@dataclass(frozen=True)
class DispatchContext:
    instances: Sequence[InstanceView]
    request_id: str
    predicted_tokens: float
    prompt_tokens: int
    now: float
    counter: int = 0  # dispatches so far, for round-robin
    true_tokens: int | None = None  # the oracle's input; benchmarks only
    impact_weight: float = 1.0


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


def _load(view: InstanceView) -> float:
    kv = view.kv_usage if view.kv_usage is not None and math.isfinite(view.kv_usage) else 0.0
    share = view.in_flight / view.cap if view.cap < 1 << 30 else view.in_flight / 64
    return kv + share + view.waiting


def predictive(ctx: DispatchContext) -> Decision:
    """Block-style: roll each instance's batch forward with predicted remaining lengths and its
    latency model; score = the new request's predicted latency plus (``impact_weight`` times)
    the delay it adds to the requests already there. The lowest score wins."""
    length = max(ctx.predicted_tokens, 1.0)
    scores = {v.name: _predicted_cost(v, ctx, length) for v in _free(ctx)}
    return _lowest(scores, "predictive")


def oracle(ctx: DispatchContext) -> Decision:
    """``predictive`` with the true output length: the bound a perfect predictor would reach."""
    length = float(ctx.true_tokens if ctx.true_tokens is not None else ctx.predicted_tokens)
    scores = {v.name: _predicted_cost(v, ctx, max(length, 1.0)) for v in _free(ctx)}
    return _lowest(scores, "oracle")


def _predicted_cost(view: InstanceView, ctx: DispatchContext, length: float) -> float:
    own, delay = rollout(view, length, ctx.prompt_tokens)
    return own + ctx.impact_weight * delay


def rollout(view: InstanceView, length: float, prompt_tokens: int) -> tuple[float, float]:
    """(latency of a new request of ``length`` output tokens, total delay it adds to the others).

    With remaining lengths r_1 <= ... <= r_n, the batch holds 1 + #{r_i > k} sequences at the
    new request's k-th step; each running request is slowed by one ``step_per_seq_s`` for every
    step the two share.

    >>> v = InstanceView("a", remaining=(10.0,), step_base_s=0.01, step_per_seq_s=0.001)
    >>> own, delay = rollout(v, 20, 0)
    >>> round(own, 4), round(delay, 4)  # 10 steps with 2 sequences, then 10 alone
    (0.23, 0.01)
    """
    remaining = sorted(r for r in view.remaining if r > 0)
    own = prompt_tokens * view.prefill_s_per_token
    done = 0.0
    running = len(remaining) + 1
    for r in remaining:
        if r >= length:
            break
        own += (r - done) * (view.step_base_s + view.step_per_seq_s * running)
        done = r
        running -= 1
    own += (length - done) * (view.step_base_s + view.step_per_seq_s * running)
    delay = view.step_per_seq_s * sum(min(r, length) for r in remaining)
    return own, delay


def _lowest(scores: dict[str, float], policy: str) -> Decision:
    if not scores:
        return Decision(None, policy)
    best = min(scores, key=lambda name: scores[name])  # first of equals: configuration order
    return Decision(best, policy, scores)


POLICIES: dict[str, Policy] = {
    "predictive": predictive,
    "least-load": least_load,
    "round-robin": round_robin,
    "random": random_choice,
    "oracle": oracle,
}


def priority_key(predicted_tokens: float, arrived_at: float, aging_s: float) -> float:
    """Shortest predicted first, with aging: a request that arrived ``aging_s`` seconds earlier
    outranks one predicted twice as short, so nothing starves. Lower is served first.

    The key never changes while a request waits, so a heap orders the queue.

    >>> priority_key(100, 0.0, 5.0) < priority_key(10, 30.0, 5.0)  # waited 30 s longer
    True
    >>> priority_key(10, 0.0, 5.0) < priority_key(100, 0.0, 5.0)
    True
    """
    size = math.log2(1.0 + max(predicted_tokens, 0.0)) if math.isfinite(predicted_tokens) else 64
    return arrived_at / aging_s + size


def vllm_priority(key: float, origin: float, aging_s: float) -> int:
    """The key as vLLM's integer priority (lower first), relative to ``origin`` (the daemon's
    start) so the numbers stay small; a tenth of a doubling per unit."""
    return round((key - origin / aging_s) * 10)
