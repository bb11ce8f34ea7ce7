"""The simulated vLLM engine: batching, chunked prefill, KV blocks, preemption, queue policies."""

from __future__ import annotations

import dataclasses

import pytest

from steersman.control.sim.engine import SimEngine, SimRequest
from steersman.control.sim.profiles import PROFILES, StepModel
from steersman.control.sim.virtual import round_robin, run_cluster

UNIT = StepModel(
    "unit",
    a=1.0,
    b=0.0,
    c=0.0,
    d=0.0,
    num_blocks=1000,
    block_size=16,
    max_num_seqs=8,
    max_num_batched_tokens=2048,
    max_model_len=8192,
)


def _drain(engine: SimEngine, now: float = 0.0) -> float:
    while engine.has_work():
        plan = engine.plan()
        assert plan is not None, "work left that can never be scheduled"
        now += plan.duration
        engine.finish(plan, now)
    return now


def test_one_request_prefills_then_decodes_a_token_per_step():
    engine = SimEngine(UNIT)
    r = SimRequest("a", 0.0, prompt_tokens=100, output_tokens=5)
    engine.add(r)
    end = _drain(engine)
    assert (r.first_token_at, r.finished_at, end) == (1.0, 5.0, 5.0)
    assert engine.free_blocks == UNIT.num_blocks and engine.stats.steps == 5


def test_step_time_follows_the_model():
    model = dataclasses.replace(UNIT, a=0.01, b=0.001, c=0.1, d=0.0001)
    engine = SimEngine(model)
    engine.add(SimRequest("a", 0.0, prompt_tokens=200, output_tokens=3))
    first = engine.plan()
    assert (first.prefill_tokens, first.decode_seqs, first.context_tokens) == (200, 0, 200)
    assert first.duration == pytest.approx(0.01 + 0.2 + 0.02)
    engine.finish(first, first.duration)
    second = engine.plan()
    assert (second.prefill_tokens, second.decode_seqs, second.context_tokens) == (0, 1, 201)
    assert second.duration == pytest.approx(0.01 + 0.1 + 0.0201)


def test_each_request_whose_prefill_begins_costs_e_once():
    engine = SimEngine(dataclasses.replace(UNIT, e=0.5, max_num_batched_tokens=100))
    engine.add(SimRequest("a", 0.0, prompt_tokens=10, output_tokens=3))
    engine.add(SimRequest("b", 0.0, prompt_tokens=150, output_tokens=3))
    first = engine.plan()  # a's whole prompt and b's first 90 tokens: two joins
    assert first.duration == pytest.approx(1.0 + 2 * 0.5)
    engine.finish(first, first.duration)
    second = engine.plan()  # b's last 60 prompt tokens and a's decode: nobody new
    assert second.duration == pytest.approx(1.0)


def test_a_request_waits_longer_to_reach_an_idle_engine():
    model = dataclasses.replace(UNIT, admission_s=0.1, wake_s=2.0)
    a = SimRequest("a", 0.0, prompt_tokens=10, output_tokens=3)
    b = SimRequest("b", 2.5, prompt_tokens=10, output_tokens=3)  # during a's first step
    run_cluster([a, b], [SimEngine(model)], round_robin())
    assert a.first_token_at == pytest.approx(0.0 + 2.1 + 1.0)
    assert b.first_token_at == pytest.approx(3.1 + 1.0)  # queued at 2.6, joins the next step


def test_long_prompts_prefill_in_chunks_within_the_token_budget():
    engine = SimEngine(UNIT)
    r = SimRequest("long", 0.0, prompt_tokens=5000, output_tokens=2)
    engine.add(r)
    _drain(engine)
    assert r.first_token_at == 3.0  # 2048 + 2048 + 904 prompt tokens


def test_continuous_batching_admits_up_to_max_num_seqs():
    engine = SimEngine(dataclasses.replace(UNIT, max_num_seqs=2))
    reqs = [SimRequest(f"r{i}", 0.0, 10, 4) for i in range(3)]
    for r in reqs:
        engine.add(r)
    _drain(engine)
    assert [r.first_token_at for r in reqs] == [1.0, 1.0, 5.0]
    assert [r.finished_at for r in reqs] == [4.0, 4.0, 8.0]


@pytest.mark.parametrize(
    ("policy", "order"),
    [("priority", ["urgent", "normal", "late"]), ("fcfs", ["late", "normal", "urgent"])],
)
def test_queue_policies(policy, order):
    engine = SimEngine(dataclasses.replace(UNIT, max_num_seqs=1), policy=policy)
    for name, priority in (("late", 9), ("normal", 5), ("urgent", 0)):
        engine.add(SimRequest(name, 0.0, 10, 2, priority=priority))
    done = []
    now = 0.0
    while engine.has_work():
        plan = engine.plan()
        now += plan.duration
        done += [r.id for r in engine.finish(plan, now)]
    assert done == order


@pytest.mark.parametrize("policy", ["fcfs", "priority"])
def test_running_out_of_kv_blocks_preempts_by_recompute(policy):
    # 12 blocks of 16 slots: three requests of 48-token prompts fill 9 blocks, and their growth
    # forces preemptions.
    model = dataclasses.replace(UNIT, num_blocks=12)
    engine = SimEngine(model, policy=policy)
    reqs = [SimRequest(f"r{i}", 0.0, 48, 40, priority=i) for i in range(3)]
    for r in reqs:
        engine.add(r)
    _drain(engine)
    assert all(r.generated == 40 and r.finished_at is not None for r in reqs)
    assert engine.stats.preemptions > 0
    victims = [r.id for r in reqs if r.preemptions]
    assert "r0" not in victims  # the first admitted / most urgent request keeps running
    assert engine.free_blocks == 12


def test_a_request_too_long_for_the_window_is_refused():
    engine = SimEngine(dataclasses.replace(UNIT, max_model_len=100))
    with pytest.raises(ValueError, match="100-token window"):
        engine.add(SimRequest("x", 0.0, 90, 20))


def test_abort_frees_blocks():
    engine = SimEngine(UNIT)
    r = SimRequest("a", 0.0, 100, 50)
    engine.add(r)
    plan = engine.plan()
    engine.finish(plan, plan.duration)
    assert engine.free_blocks < UNIT.num_blocks
    engine.abort(r)
    assert engine.free_blocks == UNIT.num_blocks and not engine.has_work()


def _workload(n: int, rate: float) -> list[SimRequest]:
    import random

    rng = random.Random(4)
    t, out = 0.0, []
    for i in range(n):
        out.append(SimRequest(f"r{i}", t, rng.randint(20, 1500), rng.randint(1, 400)))
        t += rng.expovariate(rate)
    return out


@pytest.mark.parametrize("extras", [{}, {"e": 0.003, "admission_s": 0.002, "wake_s": 0.004}])
def test_decode_runs_match_single_steps_exactly(extras):
    model = dataclasses.replace(PROFILES["a100-llama2-7b"], num_blocks=600, **extras)

    def run(fast: bool) -> dict[str, tuple[float, float]]:
        engines = [SimEngine(model) for _ in range(3)]
        if not fast:
            for e in engines:
                e.plan_decode_run = lambda *_: None  # type: ignore[method-assign]
        result = run_cluster(_workload(300, 6.0), engines, round_robin())
        assert len(result.finished) == 300
        return {r.id: (r.first_token_at, r.finished_at) for r in result.finished}

    fast, slow = run(True), run(False)
    assert fast.keys() == slow.keys()
    for key in fast:
        assert fast[key] == pytest.approx(slow[key], rel=1e-9, abs=1e-9)


def test_cluster_dispatch_sees_each_engine_and_every_request_finishes():
    seen = []

    def least_waiting(req, engines, now):
        seen.append(now)
        return min(range(len(engines)), key=lambda k: (engines[k].waiting, len(engines[k].running)))

    arrivals = _workload(200, 20.0)
    run = run_cluster(
        arrivals, [SimEngine(PROFILES["a100-llama2-7b"]) for _ in range(4)], least_waiting
    )
    assert len(run.finished) == 200 and seen == [r.arrival for r in arrivals]
    assert all(
        r.first_token_at >= r.arrival and r.finished_at >= r.first_token_at for r in run.finished
    )
    assert {len([1 for e in run.engines if e.stats.finished])} == {4}


def _chat(n_segments: int, tail: int) -> tuple[int, ...]:
    from steersman.control.core.prefix import chain

    return chain([[s] * 16 for s in range(n_segments)] + [[1000 + tail] * 16])


def test_a_cached_prefix_skips_its_prefill_and_counts_as_vllm_does():
    engine = SimEngine(UNIT)
    first = SimRequest("a", 0.0, prompt_tokens=160, output_tokens=2, segment_tokens=16)
    first.prefix = _chat(9, 0)
    engine.add(first)
    _drain(engine)
    second = SimRequest("b", 0.0, prompt_tokens=160, output_tokens=2, segment_tokens=16)
    second.prefix = _chat(9, 1)  # the same 144 tokens, then its own
    engine.add(second)
    plan = engine.plan()
    assert (first.cached_tokens, second.cached_tokens) == (0, 144)
    assert plan.prefill_tokens == 160 - 144
    assert (engine.cache.queries, engine.cache.hits) == (320, 144)


def test_cached_blocks_are_evicted_least_recently_used_when_room_is_needed():
    model = dataclasses.replace(UNIT, num_blocks=12)
    engine = SimEngine(model)
    for k, tail in enumerate((0, 1)):
        r = SimRequest(f"r{k}", 0.0, prompt_tokens=160, output_tokens=1, segment_tokens=16)
        r.prefix = _chat(9, tail) if k == 0 else tuple(x + 1 for x in _chat(9, tail))
        engine.add(r)
        _drain(engine)  # the first one's 10 blocks are cached; the second one needs them
    again = SimRequest("again", 0.0, prompt_tokens=160, output_tokens=1, segment_tokens=16)
    again.prefix = _chat(9, 0)
    engine.add(again)
    _drain(engine)
    assert again.cached_tokens < 144  # evicted to make room for the second prompt
    assert engine.free_blocks == model.num_blocks


# -- the streamed-QoE rule (core.qoe_rule) inside the engine ----------------------------------

QOE_MODEL = dataclasses.replace(UNIT, a=0.01, num_blocks=17, max_num_seqs=8)


def _crowded(qoe) -> tuple[SimEngine, SimRequest, SimRequest, float]:
    """A stream that ran far ahead of its reader fills the cache; a newcomer waits for room."""
    engine = SimEngine(QOE_MODEL, qoe=qoe)
    ahead = SimRequest("ahead", 0.0, prompt_tokens=150, output_tokens=110)
    engine.add(ahead)
    now = 0.0
    while ahead.generated < 100:
        plan = engine.plan(now)
        now += plan.duration
        engine.finish(plan, now)
    late = SimRequest("late", now - 2.0, prompt_tokens=100, output_tokens=20)  # first token due
    engine.add(late)
    return engine, ahead, late, now


def test_qoe_rule_pauses_the_stream_ahead_of_its_reader_for_an_overdue_one():
    from steersman.control.core.settings import QoeSettings

    engine, ahead, late, now = _crowded(QoeSettings(enabled=True, protect_s=0.0, max_pauses=1))
    plan = engine.plan(now)
    assert [r.id for r, _ in plan.work] == ["late"]
    assert ahead.preemptions == 1 and ahead.paused_at == now
    now += plan.duration
    engine.finish(plan, now)
    while engine.has_work():
        plan = engine.plan(now)
        now += plan.duration
        engine.finish(plan, now)
    assert late.finished_at < ahead.finished_at
    (paused, resumed, had), *_ = ahead.stalls  # what its reader saw: a pause, then more tokens
    assert paused < resumed and had == 100


@pytest.mark.parametrize(
    "qoe",
    [
        None,
        {"enabled": False},
        {"enabled": True, "max_pauses": 1, "protect_s": 1000.0},
        {"enabled": True, "max_pauses": 0, "protect_s": 0.0},
    ],
    ids=["no rule", "rule off", "rule on, the stream protected", "rule on, no pauses"],
)
def test_without_the_qoe_rule_the_engine_order_stands(qoe):
    from steersman.control.core.settings import QoeSettings

    engine, ahead, _late, now = _crowded(None if qoe is None else QoeSettings(**qoe))
    plan = engine.plan(now)
    assert [r.id for r, _ in plan.work] == ["ahead"]
    assert ahead.preemptions == 0 and not ahead.stalls


def test_the_engine_counts_the_prefill_a_request_decodes_beside():
    engine = SimEngine(UNIT)
    a = SimRequest("a", 0.0, prompt_tokens=100, output_tokens=6)
    engine.add(a)
    now = 0.0
    for _ in range(2):  # a's prefill, then a decode step
        plan = engine.plan()
        now += plan.duration
        engine.finish(plan, now)
    b = SimRequest("b", now, prompt_tokens=300, output_tokens=2)
    engine.add(b)
    _drain(engine, now)
    assert engine.stats.prefill_tokens == 400
    assert engine.stats.prefill_tokens - a.prefill_mark == 300  # b's prompt, not its own
    assert engine.stats.prefill_tokens - b.prefill_mark == 0
