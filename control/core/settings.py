"""Settings of the scheduling core: the controller's thresholds and the dispatch policy, as the
one settings tree holds them; the core's functions take these models as they are."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from steersman.learners.features import CLASSES

PolicyName = Literal[
    "predictive", "least-load", "prefix-affinity", "round-robin", "random", "oracle"
]


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ControllerSettings(_Section):
    miss_threshold: float = Field(
        default=0.3,
        gt=0,
        description="A miss: the actual length more than this share outside the band the request "
        "was scheduled with (miss_rule band), or the point off by more than this share of the "
        "actual length (miss_rule point).",
    )
    miss_rule: Literal["band", "point"] = Field(
        default="band",
        description="band: misses mean the predictor broke (the world's own spread is in the "
        "band); point: the source design's rule, which a heavy-tailed length mostly misses.",
    )
    miss_streak: int = Field(default=5, ge=1, description="Consecutive misses that start FALLBACK.")
    fallback_s: float = Field(default=60.0, gt=0, description="Longest FALLBACK period.")
    recover_hits: int = Field(
        default=10, ge=1, description="Consecutive shadow hits that end FALLBACK early."
    )
    min_rank: float = Field(
        default=0.15,
        ge=0,
        lt=1,
        description="FALLBACK also when the length model's predictions stop ordering requests: "
        "the correlation of its log predictions with the log actual lengths over the recent "
        "window (rank_window) falls below this (a constant or shuffled model, which "
        "the online corrector would otherwise calibrate bands around). 0: off.",
    )
    rank_window: int = Field(
        default=60, ge=10, description="Recent outcomes the ranking check is computed over."
    )
    compensation_a: float = Field(default=1.2, gt=0, description="Initial a in a*length + b.")
    compensation_b: float = Field(default=10.0, ge=0, description="Initial b in a*length + b.")
    a_min: float = Field(default=0.5, gt=0, description="Lowest a.")
    a_max: float = Field(default=3.0, gt=0, description="Highest a.")
    b_max: float = Field(default=64.0, ge=0, description="Highest b.")
    adjust_every: int = Field(
        default=20, ge=1, description="Requests of a class between compensation adjustments."
    )
    window: int = Field(default=50, ge=1, description="Recent requests a class adjusts from.")
    headroom: float = Field(
        default=0.1, ge=0, description="How far above the actual length scheduling aims."
    )
    step: float = Field(
        default=0.5, gt=0, le=1, description="Share of the way an adjustment moves a and b."
    )
    min_change: float = Field(
        default=0.02, ge=0, description="Smaller changes of a are not made (no churn)."
    )
    enabled: bool = Field(
        default=True, description="false: never fall back (the 'controller disabled' baseline)."
    )

    @model_validator(mode="after")
    def _bounds(self) -> ControllerSettings:
        if self.a_min > self.a_max:
            raise ValueError(f"a_min {self.a_min} is above a_max {self.a_max}")
        return self


class DispatchSettings(_Section):
    policy: PolicyName = Field(default="predictive", description="Dispatch policy in NORMAL mode.")
    fallback_policy: Literal["least-load", "round-robin"] = Field(
        default="least-load",
        description="Dispatch in FALLBACK, when the predictions are not trusted: the best "
        "policy that needs none (round-robin is the source design's choice).",
    )
    admission: Literal["kv", "count", "none"] = Field(
        default="kv",
        description="kv: a request goes to an instance only while the KV cache its requests "
        "there will need, rolled forward over their predicted lengths, stays under target_fill "
        "(and within max_in_flight); count: max_in_flight only; none: every request goes out "
        "on arrival (a plain load balancer, the baseline). The rest wait in steersman's queue, "
        "shortest predicted first with aging.",
    )
    target_fill: float = Field(
        default=0.95, gt=0, le=1, description="kv: the share of an instance's KV cache to fill."
    )
    outrank: bool = Field(
        default=True,
        description="kv: at an instance that gets length-ordered priorities (engine_order), a "
        "newcomer needs room in the projection only beside the requests there that rank ahead "
        "of it or will be done before it: vLLM's priority policy preempts the others for it when "
        "the cache runs short.",
    )
    override_fill: float = Field(
        default=1.0,
        ge=0,
        le=1,
        description="kv, work-conserving: an instance whose measured KV usage, with the "
        "newcomer's prompt, stays under this share and whose engine has (almost) no queue takes "
        "the request whatever the projection says (vLLM would start it at once, and preempting now "
        "and then costs less than holding), unless steersman's queue is backlogged; "
        "override_waiting says how short a queue counts as none.",
    )
    override_waiting: int = Field(
        default=2,
        ge=0,
        description="kv, work-conserving: the most requests an engine's own queue may hold for "
        "override_fill to apply (a newcomer behind a couple of others still starts within a step "
        "or two; holding it for the projection costs the first-token tail under bursty "
        "arrivals).",
    )
    backlog_s: float = Field(
        default=1.0,
        ge=0,
        description="kv: once the oldest request in steersman's queue has waited this long, the "
        "engines are saturated: only the projection admits, so that requests are not let in to "
        "outgrow the cache and be preempted (a burst), and the queue serves shortest first.",
    )
    max_hold_s: float = Field(
        default=0.25,
        ge=0,
        description="kv: a request that has waited this long goes out without the projection "
        "(within max_in_flight): predictions never hold one back for longer. While the best "
        "key is held, such requests go oldest first where the engine measures KV usage under "
        "target_fill with their prompt.",
    )
    max_wait_s: float | None = Field(
        default=None,
        gt=0,
        description="kv: a request that has waited this long goes out even where no engine "
        "measures room for it: vLLM's priority policy ranks it by its arrival-aged key there and "
        "preempts younger requests for it, where steersman's queue could only hold it until "
        "memory frees. None: it waits for room.",
    )
    load_margin: float = Field(
        default=0.1,
        ge=0,
        description="predictive: it chooses among the instances whose least-load load (KV usage "
        "+ share of the cap + queued requests) is within this of the lowest, so that memory and "
        "queues come first and predicted latency and cached prefixes decide among the rest.",
    )
    engine_order: Literal["backlog", "always", "pressure"] = Field(
        default="pressure",
        description="When vLLM gets length-ordered priorities (and steersman's scheduler class "
        "the predicted lengths): pressure, only at an instance whose measured KV usage is at "
        "least pressure_kv, or while steersman's queue is backlogged (there the order decides "
        "who holds the KV cache and who is preempted; elsewhere it only passes long requests "
        "over for prefill); always, for every request; backlog, only while steersman's queue "
        "is backlogged. Arrival order otherwise.",
    )
    pressure_kv: float = Field(
        default=0.9,
        ge=0,
        le=1,
        description="engine_order pressure: the measured KV usage (a share of the cache) from "
        "which an instance gets length-ordered priorities.",
    )
    aging_s: float = Field(
        default=8.0, gt=0, description="Waiting this long outranks a prediction twice as short."
    )
    unordered_size: Literal["zero", "typical"] = Field(
        default="zero",
        description="The size a request outside the length order (engine_order, FALLBACK) is "
        "ranked with where a queue mixes it with ordered ones: zero, ahead of every ordered "
        "request of its arrival (an ordered one waits behind those that arrive up to aging_s x "
        "log2(its length) later); typical, the geometric mean of recent scheduled lengths.",
    )
    impact_weight: float = Field(
        default=1.0, ge=0, description="predictive: weight of the delay added to others."
    )
    ttft_weight: float = Field(
        default=3.0,
        ge=0,
        description="predictive: what a second of waiting for the prefills already ahead of a "
        "newcomer's first token at an instance counts, against a second of its decode (a late "
        "first token is what a user sees first; 0 ignores them).",
    )
    max_queue: int = Field(default=10_000, ge=0, description="Queued requests beyond this: 429.")


class StreamExpectation(_Section):
    ttft_s: float = Field(gt=0, le=600, description="First token expected within this.")
    pace_s: float = Field(gt=0, le=60, description="Then one token every this many seconds.")


class QoeSettings(_Section):
    """Streaming quality of experience (Andes): what a reader expects, and the engine-side rule
    that serves whoever is about to stall first when the KV cache is contended."""

    enabled: bool = Field(
        default=False,
        description="Order and preempt inside the engines for streamed QoE under KV pressure "
        "(steersman's vLLM scheduler class; the simulator), and serve steersman's own queue "
        "most overdue first token first. Off: latency order only.",
    )
    expected_ttft_s: float = Field(
        default=1.0, gt=0, le=600, description="A reader expects the first token within this."
    )
    expected_pace_s: float = Field(
        default=0.2,
        gt=0,
        le=60,
        description="Then one token every this many seconds (0.2: about reading speed).",
    )
    classes: dict[str, StreamExpectation] = Field(
        default_factory=dict,
        description="Per request class (chat, code, summarization, other), its own expectation, "
        "e.g. { code = { ttft_s = 2.0, pace_s = 0.05 } }. A client's x-steersman-expected-ttft "
        "and x-steersman-expected-pace headers (seconds) override both for its request.",
    )
    kv_pressure: float = Field(
        default=0.9,
        gt=0,
        le=1,
        description="The rule runs while requests wait and the KV cache is at least this full "
        "(or every seat is taken); below it the engine's own order stands.",
    )
    horizon_s: float = Field(
        default=2.0, gt=0, description="The gain of serving versus pausing is over this span."
    )
    interval_s: float = Field(
        default=0.1, gt=0, description="The rule is applied at most this often per engine."
    )
    protect_s: float = Field(
        default=2.0,
        ge=0,
        description="A request that (re)started running within this is not paused (no thrash).",
    )
    min_left_tokens: int = Field(
        default=16, ge=0, description="A request predicted to have this few left is not paused."
    )
    unknown_tokens: float = Field(
        default=256.0,
        gt=0,
        description="What every request is taken to have left without predicted_lengths (and "
        "a request without a prediction with it).",
    )
    predicted_lengths: bool = Field(
        default=False,
        description="Weigh each stream's stall by its predicted length (a short answer's stall "
        "weighs more). Off: every stream is taken to have unknown_tokens left, as Andes does; "
        "under overload that served more readers well (docs/benchmarks.md).",
    )
    max_pauses: int = Field(
        default=0,
        ge=0,
        description="Times the rule may pause (preempt) one request for others; 0: it only "
        "orders admissions. vLLM preempts by recompute (Andes swapped to host memory), and "
        "on the profiles benchmarked the recompute cost more QoE than the pauses won "
        "(docs/benchmarks.md): raise it where preemption is cheap.",
    )

    @field_validator("classes")
    @classmethod
    def _known_classes(cls, value: dict[str, StreamExpectation]) -> dict[str, StreamExpectation]:
        unknown = sorted(set(value) - set(CLASSES))
        if unknown:
            raise ValueError(f"unknown request class {unknown[0]!r}: one of {', '.join(CLASSES)}")
        return value

    def expectation(self, request_class: str | None = None) -> tuple[float, float]:
        """(expected TTFT, expected pace) for a request class."""
        e = self.classes.get(request_class or "")
        return (e.ttft_s, e.pace_s) if e else (self.expected_ttft_s, self.expected_pace_s)
