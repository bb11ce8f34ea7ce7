"""KV-aware admission in the scheduling core: requests go where their footprint, rolled forward
over the predicted lengths, fits; otherwise they wait, shortest predicted first."""

from __future__ import annotations

from dataclasses import replace

import pytest

from steersman.control.core.scheduler import Arrival, InstanceState, Outcome, Scheduler
from steersman.control.core.settings import ControllerSettings, DispatchSettings
from steersman.learners.remaining import RemainingLength

CAPACITY = 1000  # KV tokens per instance: target_fill 0.95 leaves 950


def core(**dispatch) -> Scheduler:
    """Outranking off unless asked for: these tests pin the projection itself."""
    dispatch = {"outrank": False, **dispatch}
    settings = DispatchSettings(policy="least-load", aging_s=1000.0, **dispatch)
    return Scheduler(settings, ControllerSettings(enabled=False))


def state(name="a", *, usage=0.9, waiting=3, cap=100, capacity=CAPACITY) -> InstanceState:
    """By default the engine reports a busy cache and a queue longer than the work-conserving
    override allows (``override_waiting``, 2): no override."""
    return InstanceState(name, cap=cap, kv_usage=usage, waiting=waiting, kv_capacity=capacity,
                         block=0)  # fmt: skip


def send(s: Scheduler, rid: str, prompt: int, tokens: float, now: float = 0.0) -> None:
    # Compensation is 1.2 x + 10: a base of (t - 10) / 1.2 schedules t tokens.
    s.add(Arrival(rid, prompt, {"base_tokens": (tokens - 10) / 1.2}), now)


def placed(s: Scheduler, *instances: InstanceState, now: float = 0.0) -> list[str]:
    return [a.request_id for a in s.schedule(list(instances), now)]


@pytest.mark.parametrize(
    ("newcomer", "admitted"),
    [
        pytest.param((100, 50), True, id="short: done before the crowd grows"),
        pytest.param((100, 460), False, id="long: outlives the crowd at its peak"),
        pytest.param((500, 50), False, id="a prompt the cache cannot hold beside them"),
    ],
)
def test_a_request_goes_only_where_its_lifetime_footprint_fits(newcomer, admitted):
    s = core()
    send(s, "big", 400, 500)  # 400 + 500 = 900 of 950 at its end
    assert placed(s, state()) == ["big"]  # nothing of ours there yet: it takes anything
    send(s, "new", *newcomer)
    assert (placed(s, state()) == ["new"]) is admitted
    assert s.depth == (0 if admitted else 1)
    assert s.stats.kv_held == (0 if admitted else 1)


@pytest.mark.parametrize(
    ("newcomer", "usage", "outrank", "admitted"),
    [
        pytest.param((100, 460), 0.9, True, True, id="it outranks the one there: vLLM preempts it"),
        pytest.param((100, 460), 0.5, True, False, id="arrival order there: no preemption for it"),
        pytest.param((100, 460), 0.9, False, False, id="outranking off: the projection alone"),
        pytest.param((100, 600), 0.9, True, False, id="it ranks behind the one there"),
    ],
)
def test_where_vllm_gets_priorities_a_newcomer_needs_room_only_beside_those_ahead(
    newcomer, usage, outrank, admitted
):
    s = core(outrank=outrank)
    send(s, "big", 400, 500)
    placed(s, state())
    send(s, "new", *newcomer)
    assert (placed(s, state(usage=usage)) == ["new"]) is admitted


def test_a_request_nearly_done_is_not_preempted_for_one_that_outranks_it():
    s = core(outrank=True)
    send(s, "big", 400, 500)
    placed(s, state())
    s.progress("big", 480)  # a tenth of its prediction left, less than the newcomer's
    send(s, "new", 100, 460)
    assert placed(s, state()) == []
    s.finish("big", Outcome(500), now=1.0)
    assert placed(s, state(), now=1.0) == ["new"]


def test_the_engine_measuring_room_and_no_queue_admits_anyway():
    s = core()
    send(s, "big", 400, 500)
    placed(s, state())
    send(s, "new", 100, 460)
    assert placed(s, state(usage=0.95, waiting=0)) == []  # no room for its prompt: it stands
    assert placed(s, state(usage=0.2, waiting=3)) == []  # the engine has a queue: it stands
    assert placed(s, state(usage=0.2, waiting=0)) == ["new"]  # room the projection did not see
    assert s.stats.kv_overrides == 1


@pytest.mark.parametrize(
    ("waiting", "override_waiting", "admitted"),
    [
        pytest.param(0, 0, True, id="no queue"),
        pytest.param(1, 0, False, id="any queue, where none is allowed"),
        pytest.param(2, 2, True, id="a short queue (the default)"),
        pytest.param(3, 2, False, id="a longer queue"),
    ],
)
def test_how_short_an_engine_queue_counts_as_none(waiting, override_waiting, admitted):
    s = core(override_waiting=override_waiting)
    send(s, "big", 400, 500)
    placed(s, state())
    send(s, "new", 100, 460)
    assert (placed(s, state(usage=0.2, waiting=waiting)) == ["new"]) is admitted
    assert s.stats.kv_overrides == int(admitted)


@pytest.mark.parametrize(
    ("waited", "admitted"),
    [
        pytest.param(0.4, True, id="a queue that moves: measured room admits"),
        pytest.param(0.6, False, id="backlogged: the projection alone admits"),
    ],
)
def test_a_backlogged_queue_turns_the_measured_room_off(waited, admitted):
    s = core(backlog_s=0.5, max_hold_s=10.0)
    send(s, "big", 400, 500)
    placed(s, state())
    send(s, "new", 100, 460, now=0.0)
    assert placed(s, state(usage=0.95, waiting=0), now=waited) == []  # no room measured either
    assert (placed(s, state(usage=0.2, waiting=0), now=waited) == ["new"]) is admitted
    assert s.stats.kv_overrides == int(admitted)


def test_it_picks_the_instance_with_room_and_the_count_cap_still_bounds():
    s = core()
    send(s, "big", 400, 500)
    assert placed(s, state("a"), state("b", cap=0)) == ["big"]
    send(s, "long", 100, 460)
    assert placed(s, state("a"), state("b", cap=1)) == ["long"]  # only b has room for it
    assert s.running("b") == {"long": 0}
    send(s, "more", 10, 10)
    assert placed(s, state("a", cap=1), state("b", cap=1)) == []  # both at their cap


def test_what_is_left_of_requests_past_their_prediction_is_refined():
    learned = RemainingLength(window=100, refresh_every=10, min_samples=10)
    for _ in range(50):  # this class runs twice as long as scheduled
        learned.learn_one({"request_class": "other", "scheduled": 100.0}, 200)
    s = Scheduler(DispatchSettings(policy="least-load"), ControllerSettings(enabled=False),
                  remaining=learned)  # fmt: skip
    send(s, "old", 100, 100)
    placed(s, state())
    s.progress("old", 150)  # past its prediction: half of it again is expected, not a tenth
    send(s, "new", 700, 100)
    # 100 + 150 + 50 left, with 700 + 50 of the newcomer, is over 950: it waits.
    assert placed(s, state()) == []
    s.finish("old", Outcome(200), now=1.0)
    assert placed(s, state(), now=1.0) == ["new"]


@pytest.mark.parametrize(
    ("now", "usage", "placed_now", "max_wait_s"),
    [
        pytest.param(0.2, 0.5, [], None, id="within max_hold_s: both wait"),
        pytest.param(0.3, 0.5, ["long"], None, id="past it: the newcomer ahead does not hold it"),
        pytest.param(0.3, 0.95, [], None, id="past it, but the engine measures no room either"),
        pytest.param(0.3, 0.95, [], 0.3, id="not yet past max_wait_s: it waits for room"),
        pytest.param(0.3, 0.95, ["long"], 0.28, id="past max_wait_s: vLLM's queue holds it"),
    ],
)
def test_past_max_hold_s_a_request_behind_a_held_better_key_goes_where_there_is_room(
    now, usage, placed_now, max_wait_s
):
    s = core(max_hold_s=0.25, max_wait_s=max_wait_s)
    send(s, "big", 400, 500)
    placed(s, state())
    send(s, "long", 100, 460, now=0.0)
    send(s, "short", 400, 100, now=now)  # the better key, and held: 900 + 400 + 100 > 950
    assert placed(s, state(usage=usage), now=now) == placed_now
    assert s.depth == 2 - len(placed_now)
    assert s.stats.kv_held == 1


def test_unknown_capacity_falls_back_to_the_count_cap():
    s = core()
    for k in range(3):
        send(s, f"r{k}", 10_000, 10_000)
    assert placed(s, state(capacity=None, cap=2)) == ["r0", "r1"]


def test_waiting_requests_go_shortest_predicted_first():
    s = core()
    send(s, "big", 400, 500)
    placed(s, state())
    for rid, tokens in (("long", 400), ("short", 20), ("mid", 100)):
        send(s, rid, 10, tokens)
    s.finish("big", Outcome(500), now=1.0)
    assert placed(s, state(), now=1.0) == ["short", "mid", "long"]


@pytest.mark.parametrize(
    ("ttfts", "order"),
    [
        pytest.param((None, None), ["early", "late"], id="no expectations: arrival order"),
        pytest.param((5.0, 0.5), ["late", "early"], id="the first token due sooner goes first"),
        pytest.param(
            (5.0, float("nan")), ["late", "early"], id="an odd expectation: due on arrival"
        ),
    ],
)
def test_with_streamed_qoe_the_queue_takes_first_tokens_by_when_they_are_due(ttfts, order):
    s = Scheduler(
        DispatchSettings(policy="least-load", aging_s=1.0), ControllerSettings(enabled=False)
    )
    s.add(Arrival("big", 400, {"base_tokens": 400.0}), 0.0)
    placed(s, state())
    for rid, at, ttft in (("early", 0.0, ttfts[0]), ("late", 1.0, ttfts[1])):
        s.add(Arrival(rid, 10, {"base_tokens": 100.0}, expected_ttft_s=ttft), at)
    s.finish("big", Outcome(400), now=2.0)
    assert placed(s, state(), now=2.0) == order


@pytest.mark.parametrize(("waited", "ordered"), [(0.4, False), (0.6, True)])
def test_with_engine_order_backlog_vllm_is_ordered_only_while_the_queue_is_backlogged(
    waited, ordered
):
    s = core(backlog_s=0.5, max_hold_s=10.0, engine_order="backlog")
    send(s, "big", 400, 500)
    placed(s, state())
    send(s, "new", 100, 50, now=0.0)  # fits: the projection admits it either way
    ticket = s.scheduled("new")
    (a,) = s.schedule([state()], now=waited)
    assert a.ordered is ordered
    assert a.priority == (ticket.priority if ordered else ticket.arrival_priority)


@pytest.mark.parametrize(
    ("usage", "waited", "ranks", "ordered"),
    [
        pytest.param(0.5, 0.0, False, False, id="memory to spare: arrival order"),
        pytest.param(0.9, 0.0, False, True, id="usage at pressure_kv: by length"),
        pytest.param(None, 0.0, False, False, id="usage not measured: arrival order"),
        pytest.param(0.5, 0.6, False, True, id="backlogged: by length wherever it goes"),
        pytest.param(0.5, 0.0, True, True, id="steersman's class: every prediction"),
    ],
)
def test_with_engine_order_pressure_vllm_is_ordered_where_memory_binds(
    usage, waited, ranks, ordered
):
    s = core(backlog_s=0.5, admission="count", engine_order="pressure", pressure_kv=0.9)
    send(s, "new", 100, 50, now=0.0)
    ticket = s.scheduled("new")
    (a,) = s.schedule([replace(state(usage=usage, waiting=0), ranks=ranks)], now=waited)
    assert a.ordered is ordered
    assert a.priority == (ticket.priority if ordered else ticket.arrival_priority)


def test_with_engine_order_always_vllm_is_ordered_by_length_from_the_first_request():
    s = core(backlog_s=0.5, max_hold_s=10.0, engine_order="always")
    send(s, "new", 100, 50, now=0.0)
    (a,) = s.schedule([state(usage=0.1, waiting=0)], now=0.0)
    assert a.ordered and a.priority == s.scheduled("new").priority


@pytest.mark.parametrize(
    ("others", "usage", "admitted"),
    [
        pytest.param(0, 0.9, True, id="alone: the engine's usage is our own requests"),
        pytest.param(3, 0.3, True, id="a replica's requests leave room"),
        pytest.param(3, 0.9, False, id="a replica's requests fill the cache"),
    ],
)
def test_what_another_replica_holds_at_an_engine_is_not_room(others, usage, admitted):
    s = core()
    send(s, "r1", 100, 100)
    assert placed(s, state(usage=0.0, waiting=0)) == ["r1"]  # ours: 100 + 100 at the end
    send(s, "r2", 100, 100)
    shared = InstanceState("a", cap=100, kv_usage=usage, waiting=1, kv_capacity=CAPACITY,
                           block=0, others=others)  # fmt: skip
    assert placed(s, shared) == (["r2"] if admitted else [])


def test_another_replicas_requests_count_against_the_cap():
    s = core(admission="count")
    send(s, "r1", 10, 10)
    busy = InstanceState("a", cap=4, others=4)
    assert placed(s, busy) == []
    assert placed(s, InstanceState("a", cap=4, others=3)) == ["r1"]


def test_a_request_with_candidates_goes_only_to_one_of_them():
    s = core(admission="count")
    s.add(Arrival("r1", 10, {"base_tokens": 10.0}, candidates=frozenset({"b"})), 0.0)
    a, b = InstanceState("a", cap=4), InstanceState("b", cap=4, others=1)  # a is less loaded
    assert [x.instance for x in s.schedule([a, b], 0.0)] == ["b"]
    s.add(Arrival("r2", 10, {"base_tokens": 10.0}, candidates=frozenset({"b"})), 0.0)
    assert s.schedule([a, InstanceState("b", cap=1, others=1)], 0.0) == []  # waits for b
