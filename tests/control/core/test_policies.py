"""Dispatch policies and priority: pure functions, checked on hand-built instance views."""

from __future__ import annotations

import pytest

from steersman.control.core.policies import (
    POLICIES,
    DispatchContext,
    InstanceView,
    least_load,
    oracle,
    predictive,
    prefix_affinity,
    random_choice,
    rollout,
    round_robin,
)
from steersman.control.core.priority import priority_key


def ctx(views, predicted=100.0, counter=0, true_tokens=None, request_id="r1", prompt=50):
    return DispatchContext(views, request_id, predicted, prompt, 0.0, counter, true_tokens)


def test_round_robin_cycles_and_skips_full_or_down_instances():
    views = [
        InstanceView("a"),
        InstanceView("b", healthy=False),
        InstanceView("c", in_flight=2, cap=2),
    ]
    assert round_robin(ctx(views, counter=0)).instance == "a"
    assert round_robin(ctx(views, counter=1)).instance == "a"  # b down, c full: wraps to a
    views[2] = InstanceView("c", in_flight=1, cap=2)
    assert [round_robin(ctx(views, counter=k)).instance for k in range(3)] == ["a", "c", "c"]


@pytest.mark.parametrize("name", list(POLICIES))
def test_no_free_instance_means_no_decision(name):
    views = [InstanceView("a", healthy=False), InstanceView("b", in_flight=4, cap=4)]
    decision = POLICIES[name](ctx(views, true_tokens=10))
    assert decision.instance is None


def test_least_load_prefers_free_kv_and_fewer_requests():
    views = [
        InstanceView("busy", in_flight=10, cap=20, kv_usage=0.8),
        InstanceView("idle", in_flight=1, cap=20, kv_usage=0.1),
        InstanceView("queued", in_flight=1, cap=20, kv_usage=0.1, waiting=3),
    ]
    decision = least_load(ctx(views))
    assert decision.instance == "idle"
    assert decision.scores["busy"] > decision.scores["idle"] < decision.scores["queued"]


def test_random_is_deterministic_per_request():
    views = [InstanceView(n) for n in "abcdef"]
    picks = {random_choice(ctx(views, request_id=f"r{k}")).instance for k in range(60)}
    assert len(picks) > 3
    assert random_choice(ctx(views, request_id="x")) == random_choice(ctx(views, request_id="x"))


def test_rollout_counts_batch_shrinking_and_delay_to_others():
    view = InstanceView("a", remaining=(5.0, 50.0), step_base_s=0.01, step_per_seq_s=0.002)
    own, delay = rollout(view, 20, prompt_tokens=100)
    # 100 prompt tokens of prefill, 5 steps with 3 sequences, 15 steps with 2.
    expected = 100 * view.prefill_s_per_token + 5 * (0.01 + 0.006) + 15 * (0.01 + 0.004)
    assert own == pytest.approx(expected)
    assert delay == pytest.approx(0.002 * (5 + 20))


def test_predictive_prefers_the_instance_that_frees_up_first():
    # Same number of requests in flight; on "a" they are nearly done, on "b" they have long to go.
    views = [
        InstanceView("b", in_flight=3, remaining=(400.0, 500.0, 600.0), step_per_seq_s=0.002),
        InstanceView("a", in_flight=3, remaining=(5.0, 6.0, 7.0), step_per_seq_s=0.002),
    ]
    assert predictive(ctx(views, predicted=200)).instance == "a"
    assert least_load(ctx(views)).instance == "b"  # it cannot tell them apart: first of equals


def test_predictive_accounts_for_slower_instances():
    views = [
        InstanceView("slow", step_base_s=0.05),
        InstanceView("fast", in_flight=2, remaining=(50.0, 50.0), step_base_s=0.01),
    ]
    assert predictive(ctx(views, predicted=100)).instance == "fast"


def test_oracle_uses_the_true_length():
    views = [
        InstanceView("a", in_flight=1, remaining=(30.0,), step_per_seq_s=0.01),
        InstanceView("b", step_base_s=0.0125),
    ]
    decision = oracle(ctx(views, predicted=500, true_tokens=10))
    assert decision.scores == predictive(ctx(views, predicted=10)).scores
    assert decision.scores != predictive(ctx(views, predicted=500)).scores


def test_priority_orders_short_first_and_ages():
    assert priority_key(10, 0.0, 4.0) < priority_key(1000, 0.0, 4.0)
    # A long request that has waited long enough outranks a fresh short one: no starvation.
    waited = 4.0 * 7  # log2(1001/11) is about 6.5 doublings
    assert priority_key(1000, 0.0, 4.0) < priority_key(10, waited, 4.0)
    assert priority_key(float("nan"), 0.0, 4.0) > priority_key(1e6, 0.0, 4.0)


def test_prefix_affinity_follows_the_longest_cached_prefix_then_load():
    views = [
        InstanceView("busy", in_flight=6, cached_tokens=512),
        InstanceView("idle", cached_tokens=0),
        InstanceView("idler", cached_tokens=0),
    ]
    assert prefix_affinity(ctx(views)).instance == "busy"
    views[0].cached_tokens = 0
    assert prefix_affinity(ctx(views)).instance == "idle"


def test_predictive_weighs_a_cached_prefix_against_load():
    long_prompt = 4000  # its prefill is what a cache hit saves
    warm = InstanceView("warm", in_flight=1, remaining=(20.0,), prefill_s_per_token=0.0002)
    cold = InstanceView("cold", prefill_s_per_token=0.0002)
    views = [cold, warm]
    assert predictive(ctx(views, predicted=50, prompt=long_prompt)).instance == "cold"
    warm.cached_tokens = 3968
    assert predictive(ctx(views, predicted=50, prompt=long_prompt)).instance == "warm"
    # A hot prefix does not pile everything on one instance: with enough already there, the
    # saved prefill is worth less than the wait.
    warm.in_flight, warm.remaining = 40, tuple([900.0] * 40)
    warm.step_per_seq_s = 0.002
    assert predictive(ctx(views, predicted=50, prompt=long_prompt)).instance == "cold"


def test_predictive_never_picks_a_full_instance_over_one_with_room():
    """Its roll-forward sees decode time, not memory: the load margin keeps memory first."""
    full = InstanceView("full", in_flight=2, cap=64, kv_usage=0.97, remaining=(3.0, 3.0))
    roomy = InstanceView("roomy", in_flight=8, cap=64, kv_usage=0.3, remaining=(300.0,) * 8)
    near = InstanceView("near", in_flight=8, cap=64, kv_usage=0.35, remaining=(50.0,) * 8)
    unguarded = DispatchContext([full, roomy, near], "r", 100.0, 10, 0.0)
    assert predictive(unguarded).instance == "full"
    guarded = DispatchContext([full, roomy, near], "r", 100.0, 10, 0.0, load_margin=0.1)
    decision = predictive(guarded)
    assert decision.instance == "near"  # within the margin of the lowest load, fewer steps shared
    assert set(decision.scores) == {"roomy", "near"}


def test_one_request_more_than_the_least_loaded_still_competes_on_small_instances():
    # Eight slots: one request is 0.125 of the load, more than the margin; the instance holding
    # the prompt's prefix still competes with the one that has one request less.
    holder = InstanceView(
        "holder",
        in_flight=2,
        cap=8,
        remaining=(20.0, 20.0),
        cached_tokens=900,
        prefill_s_per_token=0.001,
    )
    idle = InstanceView("idle", in_flight=1, cap=8, remaining=(20.0,), prefill_s_per_token=0.001)
    busy = InstanceView("busy", in_flight=3, cap=8, remaining=(20.0,) * 3, cached_tokens=900)
    ctx = DispatchContext([holder, idle, busy], "r", 50.0, 1000, 0.0, load_margin=0.1)
    decision = predictive(ctx)
    assert set(decision.scores) == {"holder", "idle"}
    assert decision.instance == "holder"


def test_predictive_counts_the_prefills_still_ahead_of_a_first_token():
    # Same load, same decode work: b's requests have all started, a's 3,000 prompt tokens have
    # not, and the newcomer's first token would wait behind them.
    a = InstanceView("a", in_flight=2, remaining=(50.0, 50.0), prefill_backlog=3000.0)
    b = InstanceView("b", in_flight=2, remaining=(50.0, 50.0))
    assert predictive(ctx([a, b])).instance == "b"
    scores = predictive(ctx([a, b])).scores
    assert scores["a"] - scores["b"] == pytest.approx(3000 * a.prefill_s_per_token)
