"""The engine model of one vLLM instance: continuous batching, chunked prefill, paged KV blocks
with preemption by recompute and automatic prefix caching, FCFS or priority queues, as vLLM's v1
scheduler does them.

The engine is plain state and decisions: ``plan()`` picks what the next step computes and what it
costs, ``finish(plan, end)`` applies it at the step's end. A driver owns time: the virtual-time
cluster jumps from event to event, the real-time backend sleeps for each step.
"""

from __future__ import annotations

import heapq
import itertools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from steersman.control.core.prefix import block_hashes
from steersman.control.core.qoe_rule import Stream, decide, under_pressure
from steersman.control.core.settings import QoeSettings
from steersman.control.sim.gpu import SimGpu
from steersman.control.sim.prefix_cache import PrefixCache
from steersman.control.sim.profiles import StepModel


@dataclass(slots=True, eq=False)
class SimRequest:
    id: str
    arrival: float
    prompt_tokens: int
    output_tokens: int  # the length it will generate (max_tokens with ignore_eos, or true length)
    priority: int = 0
    computed: int = 0  # tokens whose KV is computed
    generated: int = 0
    blocks: int = 0
    order: int = 0  # admission order, the tie-break of priority and the FCFS key
    first_token_at: float | None = None
    prefill_mark: int = 0  # the engine's prefill tokens computed when its first token came
    finished_at: float | None = None
    preemptions: int = 0
    predicted: float | None = None  # steersman's predicted length (the "steersman" policy)
    queued_at: float | None = None  # reached the engine's queue (a driver sets it)
    started_at: float | None = None  # first scheduled to run
    prefix: tuple[int, ...] = ()  # its prompt's (and response's) segment hashes, core.prefix
    segment_tokens: int = 0
    shared: tuple[int, ...] = ()  # cached blocks it holds (not counted in ``blocks``)
    cached_tokens: int | None = None  # prompt tokens found in the prefix cache when it started
    on_token: Callable[[SimRequest, float], None] | None = None
    # Its reader's (TTFT, pace), core.qoe; None: not streamed, the QoE rule leaves it alone.
    expectation: tuple[float, float] | None = (1.0, 0.2)
    ran_at: float | None = None  # last (re)started running
    paused_at: float | None = None  # preempted after delivering tokens, not yet resumed
    stalls: list[tuple[float, float, int]] = field(default_factory=list)  # (paused, resumed, had)

    @property
    def total(self) -> int:
        return self.prompt_tokens + self.generated


@dataclass
class Plan:
    """One step: (request, tokens to compute) pairs and the step's cost."""

    work: list[tuple[SimRequest, int]]
    prefill_tokens: int
    decode_seqs: int
    context_tokens: int
    duration: float
    steps: int = 1
    run: bool = False  # ``steps`` decode steps taken in one go (virtual time only)
    per_step: float = 0.0  # a run's first step; each later one is ``growth`` longer
    growth: float = 0.0

    def run_time(self, steps: int) -> float:
        """How long the first ``steps`` steps of a run take."""
        return steps * self.per_step + self.growth * steps * (steps - 1) / 2

    def steps_done_by(self, elapsed: float) -> int:
        """Steps of a run completed ``elapsed`` seconds after it began."""
        return _largest(lambda s: self.run_time(s) <= elapsed + 1e-12, self.steps)

    def truncated(self, steps: int) -> Plan:
        """The same run cut to its first ``steps`` steps."""
        work = [(r, steps) for r, _ in self.work]
        return Plan(
            work,
            0,
            self.decode_seqs,
            sum(r.computed + steps for r, _ in work),
            self.run_time(steps),
            steps,
            True,
            self.per_step,
            self.growth,
        )


@dataclass
class EngineStats:
    steps: int = 0
    prefill_tokens: int = 0  # computed so far: what slowed the steps of those decoding beside
    preemptions: int = 0
    finished: int = 0
    busy_s: float = 0.0


class SimEngine:
    """One simulated instance. ``policy`` is "fcfs", "priority" (lower value first, and the
    victim is the largest (priority, arrival), as vLLM's priority policy does) or "steersman"
    (steersman's vLLM scheduler class: the waiting queue by predicted remaining length with
    aging, the victim the running request that order puts last: the longest predicted remaining
    length among the youngest). With a ``gpu``, every step takes ``gpu.slowdown`` times the
    profile's time (a throttled clock, a noisy neighbour). With ``qoe`` on, under KV pressure
    the streams that gain most QoE per KV block are admitted first (and with ``max_pauses``,
    streams far ahead of their readers are paused for them): ``core.qoe_rule``, the rule
    steersman's vLLM scheduler class applies."""

    def __init__(
        self,
        model: StepModel,
        policy: str = "fcfs",
        aging_s: float = 1.0,
        prefix_caching: bool = True,
        gpu: SimGpu | None = None,
        qoe: QoeSettings | None = None,
    ) -> None:
        if policy not in ("fcfs", "priority", "steersman"):
            raise ValueError(f"unknown scheduling policy {policy!r}")
        self.model = model
        self.gpu = gpu
        self.policy = policy
        self.aging_s = aging_s
        self.cache = PrefixCache() if prefix_caching else None
        self.free_blocks = model.num_blocks  # held by no request (some of them cached)
        self.running: list[SimRequest] = []
        self._waiting: list[tuple[tuple[int, int], SimRequest]] = []
        self._order = itertools.count()
        self.stats = EngineStats()
        self.qoe = qoe if qoe is not None and qoe.enabled else None
        self._first: dict[int, int] = {}  # the QoE rule's admissions, in its order
        self._parked: set[int] = set()  # paused by the rule, readmitted by it
        self._rule_at = -math.inf

    # -- queue ----------------------------------------------------------------------------------

    def add(self, request: SimRequest) -> None:
        if request.prompt_tokens + request.output_tokens > self.model.max_model_len:
            raise ValueError(
                f"{request.id}: {request.prompt_tokens} + {request.output_tokens} "
                f"tokens exceed the {self.model.max_model_len}-token window"
            )
        request.order = next(self._order)
        heapq.heappush(self._waiting, (self._key(request), request))

    def _steered(self, r: SimRequest) -> float:
        """A running request's place in the class's order; without a prediction, its own."""
        return self._key(r)[0] if r.predicted is not None else r.priority

    def _key(self, r: SimRequest) -> tuple[float, int]:
        if self._first and id(r) in self._first:
            return (-1e18 + self._first[id(r)], r.order)
        if self._parked and id(r) in self._parked:
            return (1e18, r.order)  # paused by the QoE rule: back when the rule says so
        if self.policy == "steersman" and r.predicted is not None:
            # vLLM's class orders by size - waited/aging: the same order as size + arrival/aging.
            return (math.log2(1.0 + _remaining(r)) + r.arrival / self.aging_s, r.order)
        return (r.priority, r.order) if self.policy != "fcfs" else (0, r.order)

    @property
    def waiting(self) -> int:
        return len(self._waiting)

    def has_work(self) -> bool:
        return bool(self.running or self._waiting)

    def busy_s(self) -> float:
        return self.stats.busy_s

    def _slowdown(self, now: float | None) -> float:
        if self.gpu is None:
            return 1.0
        if now is not None:
            self.gpu.advance(now, self.stats.busy_s)
        return self.gpu.slowdown

    def kv_usage(self) -> float:
        return 1.0 - self.free_blocks / self.model.num_blocks

    def _blocks_for(self, tokens: int) -> int:
        return -(-tokens // self.model.block_size)

    # -- one step -------------------------------------------------------------------------------

    def plan(self, now: float | None = None) -> Plan | None:
        """The next step; ``now`` (when the driver knows it) marks when requests first start."""
        model = self.model
        bs = model.block_size
        budget = model.max_num_batched_tokens
        if self.qoe is not None and now is not None and now >= self._rule_at:
            self._apply_qoe_rule(now)
        work: list[tuple[SimRequest, int]] = []
        victims: set[int] = set()
        for req in list(self.running):
            if victims and id(req) in victims:
                continue  # preempted earlier in this loop
            n = min(req.prompt_tokens + req.generated - req.computed, budget)
            if n <= 0:
                continue
            need = -(-(req.computed + n) // bs) - req.blocks - len(req.shared)
            while need > self.free_blocks:
                victim = self._victim()
                self._preempt(victim, now)
                victims.add(id(victim))
                if victim is req:
                    break
            if victims and id(req) in victims:
                continue
            self._allocate(req, need)
            work.append((req, n))
            budget -= n
        if victims:
            # A victim scheduled earlier in this step gives its tokens back; nobody new joins.
            budget += sum(n for r, n in work if id(r) in victims)
            work = [(r, n) for r, n in work if id(r) not in victims]
        else:
            while self._waiting and budget > 0 and len(self.running) < model.max_num_seqs:
                req = self._waiting[0][1]
                hit = self._cached_prefix(req)
                start = max(req.computed, len(hit) * bs)
                n = min(req.prompt_tokens + req.generated - start, budget)
                need = -(-(start + n) // bs) - req.blocks - len(hit)
                if need > self.free_blocks - self._held(hit):
                    break
                heapq.heappop(self._waiting)
                self._first.pop(id(req), None)
                self._parked.discard(id(req))
                req.ran_at = now
                self._share(req, hit)
                self._allocate(req, need)
                self.running.append(req)
                if req.started_at is None:
                    req.started_at = now
                work.append((req, n))
                budget -= n
        if not work:
            return None
        prefill = decode = context = joins = 0
        for r, n in work:
            context += r.computed + n
            if n == 1 and r.computed >= r.prompt_tokens:
                decode += 1
            else:
                prefill += n
                joins += r.computed == 0
        duration = model.step_time(prefill, decode, context, joins) * self._slowdown(now)
        return Plan(work, prefill, decode, context, duration)

    def abort(self, req: SimRequest) -> None:
        """Drop a request wherever it is (a client went away); its blocks are freed."""
        if req in self.running:
            self.running.remove(req)
        else:
            self._waiting = [(k, r) for k, r in self._waiting if r is not req]
            heapq.heapify(self._waiting)
        self._release(req)

    def _head_fits(self) -> bool:
        """Whether the next step would admit the queue's head. During a run of decode steps the
        answer cannot turn to yes: the token budget stays and free blocks only shrink."""
        head = self._waiting[0][1]
        budget = self.model.max_num_batched_tokens - len(self.running)
        if budget <= 0:
            return False
        hit = self._cached_prefix(head)
        start = max(head.computed, len(hit) * self.model.block_size)
        chunk = min(head.total - start, budget)
        need = self._blocks_for(start + chunk) - head.blocks - len(hit)
        return need <= self.free_blocks - self._held(hit)

    def _victim(self) -> SimRequest:
        if self.policy == "steersman":  # the last in the waiting order, as the class does
            return max(self.running, key=lambda r: (self._steered(r), r.order))
        if self.policy == "priority":
            return max(self.running, key=lambda r: (r.priority, r.order))
        return self.running[-1]

    def _preempt(self, req: SimRequest, now: float | None) -> None:
        """Preemption by recompute: blocks freed, progress lost, back to the queue's head."""
        if req.generated and now is not None and req.paused_at is None:
            req.paused_at = now  # its reader sees nothing new until it has recomputed
        self.running.remove(req)
        self._release(req)
        req.computed = 0
        req.preemptions += 1
        self.stats.preemptions += 1
        heapq.heappush(self._waiting, (self._key(req), req))

    def finish(self, plan: Plan, end: float) -> list[SimRequest]:
        """Apply a step ending at ``end``; returns the requests that finished."""
        self.stats.steps += plan.steps
        self.stats.busy_s += plan.duration
        self.stats.prefill_tokens += plan.prefill_tokens
        done: list[SimRequest] = []
        for req, n in plan.work:
            req.computed += n
            if req.computed < req.prompt_tokens + req.generated:
                continue  # a prefill chunk: no token yet
            req.generated += 1
            if req.first_token_at is None:
                req.first_token_at = end
                req.prefill_mark = self.stats.prefill_tokens
            if req.paused_at is not None:
                req.stalls.append((req.paused_at, end, req.generated - 1))
                req.paused_at = None
            if req.on_token is not None:
                req.on_token(req, end)
            if req.generated >= req.output_tokens:
                req.finished_at = end
                self.running.remove(req)
                self._release(req)
                done.append(req)
        self.stats.finished += len(done)
        return done

    # -- streamed QoE (core.qoe_rule) ------------------------------------------------------------

    def _apply_qoe_rule(self, now: float) -> None:
        m, qoe = self.model, self.qoe
        assert qoe is not None
        if not under_pressure(
            self.kv_usage(), len(self.running), len(self._waiting), m.max_num_seqs, qoe
        ):
            return
        self._rule_at = now + qoe.interval_s
        context = sum(r.computed for r in self.running)
        step = m.step_time(0, max(len(self.running), 1), context) * self._slowdown(now)
        streams = [self._stream(r, True, now) for r in self.running if r.expectation]
        streams += [self._stream(r, False, now) for _, r in self._waiting if r.expectation]
        # One block per running request stays free for its next tokens (as Andes leaves).
        free = self.free_blocks - len(self.running)
        decision = decide(streams, free, m.max_num_seqs, step, m.max_num_batched_tokens, qoe)
        self._parked.update(id(r) for r in decision.pause)
        for req in decision.pause:
            self._preempt(req, now)
        if decision.pause or decision.admit:
            self._first = {id(r): k for k, r in enumerate(decision.admit)}
            self._waiting = [(self._key(r), r) for _, r in self._waiting]
            heapq.heapify(self._waiting)

    def _stream(self, r: SimRequest, running: bool, now: float) -> Stream:
        context = r.prompt_tokens + r.generated
        return Stream(
            r,
            running,
            r.blocks + len(r.shared) if running else self._blocks_for(context + 1),
            now - r.arrival,
            r.generated,
            _remaining(r) if r.predicted is not None else None,
            context if running else context - r.computed,
            *(r.expectation or (1.0, 0.2)),
            since_start_s=now - r.ran_at if running and r.ran_at is not None else None,
            pauses=r.preemptions,
        )

    # -- KV blocks and the prefix cache ---------------------------------------------------------

    def _hashes(self, req: SimRequest, tokens: int) -> tuple[int, ...]:
        if self.cache is None or not req.prefix:
            return ()
        return block_hashes(req.prefix, req.segment_tokens, tokens, self.model.block_size)

    def _cached_prefix(self, req: SimRequest) -> list[int]:
        """The request's leading blocks found cached, when it starts (or restarts) its prefill;
        at least its last token is always computed, as in vLLM."""
        if self.cache is None or req.computed or req.shared or not req.prefix:
            return []
        total = req.prompt_tokens + req.generated
        return self.cache.match(self._hashes(req, total), (total - 1) // self.model.block_size)

    def _held(self, hit: Sequence[int]) -> int:
        """Of these cached blocks, how many are free now (taking them uses free room)."""
        return sum(1 for h in hit if self.cache is not None and h in self.cache.free)

    def _share(self, req: SimRequest, hit: list[int]) -> None:
        cache = self.cache
        if cache is None or req.computed or req.shared:
            return
        if req.cached_tokens is None:  # vLLM counts the first lookup of a prompt
            cache.queries += req.prompt_tokens
            cache.hits += len(hit) * self.model.block_size
            req.cached_tokens = len(hit) * self.model.block_size
        if hit:
            self.free_blocks -= cache.take(hit)
            req.shared = tuple(hit)
            req.computed = len(hit) * self.model.block_size

    def _allocate(self, req: SimRequest, need: int) -> None:
        self.free_blocks -= need
        req.blocks += need
        cache = self.cache
        if cache is not None and cache.evictable > self.free_blocks:
            cache.evict(cache.evictable - self.free_blocks)  # their room is taken

    def _release(self, req: SimRequest) -> None:
        """Its blocks are free; the full ones it computed stay cached until the room is needed."""
        self.free_blocks += req.blocks
        cache = self.cache
        if cache is not None:
            own = self._hashes(req, req.computed)[len(req.shared) :]
            cache.keep(own[: req.blocks])
            self.free_blocks += cache.give(req.shared)
            req.shared = ()
        req.blocks = 0

    # -- many decode steps at once (virtual time) -----------------------------------------------

    def plan_decode_run(
        self, horizon: float = float("inf"), now: float | None = None
    ) -> Plan | None:
        """Take ``k`` pure decode steps in one go while nothing else can change: every running
        request decodes, none finishes before the k-th step, the queue cannot be admitted, the KV
        blocks suffice, and the k steps end by ``horizon``. A driver that adds a request during
        the run cuts it short with ``Plan.truncated``. Token-by-token delivery callbacks are not
        supported here."""
        running = self.running
        n = len(running)
        m = self.model
        if not running or n > m.max_num_batched_tokens:
            return None
        if self._waiting and n < m.max_num_seqs and self._head_fits():
            return None  # the queue's head would be admitted at the next step
        if self.qoe is not None and self._waiting:
            horizon = min(horizon, self.qoe.interval_s)  # the rule looks again by then
        k = m.max_model_len
        context = 0
        for r in running:
            if r.on_token is not None or r.prompt_tokens + r.generated - r.computed != 1:
                return None  # a prefill in progress, or token-by-token delivery wanted
            left = r.output_tokens - r.generated
            if left < k:
                k = left
            context += r.computed + 1
        slow = self._slowdown(now)
        base = (m.a + m.c * n + m.d * context) * slow
        growth = m.d * n * slow  # the context grows by n tokens per step
        bs = m.block_size

        def duration(steps: int) -> float:
            return steps * base + growth * steps * (steps - 1) / 2

        def blocks_needed(steps: int) -> int:
            return sum(-(-(r.computed + steps) // bs) - r.blocks - len(r.shared) for r in running)

        if duration(k) > horizon:
            k = max(1, _largest(lambda s: duration(s) <= horizon, k))
        if blocks_needed(k) > self.free_blocks:
            k = _largest(lambda s: blocks_needed(s) <= self.free_blocks, k)
        if k < 2:
            return None
        return Plan(
            [(r, k) for r in running],
            0,
            n,
            context + n * (k - 1),
            duration(k),
            steps=k,
            run=True,
            per_step=base,
            growth=growth,
        )

    def finish_decode_run(self, plan: Plan, start: float) -> list[SimRequest]:
        k = plan.steps
        bs = self.model.block_size
        end = start + plan.duration
        done = []
        for req, _ in plan.work:
            if req.paused_at is not None:
                req.stalls.append((req.paused_at, start + plan.per_step, req.generated))
                req.paused_at = None
            req.computed += k
            req.generated += k
            self._allocate(req, -(-req.computed // bs) - req.blocks - len(req.shared))
            if req.generated >= req.output_tokens:
                req.finished_at = end
                done.append(req)
        for req in done:
            self.running.remove(req)
            self._release(req)
        self.stats.steps += k
        self.stats.busy_s += plan.duration
        self.stats.finished += len(done)
        return done


def _remaining(r: SimRequest) -> float:
    """steersman's predicted remaining length (the rule of ``core.running``)."""
    p = r.predicted or 0.0
    return max(p - r.generated, 0.1 * p, 1.0)


def _largest(ok: Callable[[int], bool], upper: int) -> int:
    """The largest s in [0, upper] with ok(s), for a monotone ok (true then false)."""
    lo, hi = 0, upper
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if ok(mid):
            lo = mid
        else:
            hi = mid - 1
    return lo
