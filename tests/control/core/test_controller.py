"""The controller's transitions, table-driven: hits and misses with timestamps -> modes, events."""

from __future__ import annotations

from dataclasses import replace

import pytest

from steersman.control.core.controller import (
    Compensation,
    ControllerState,
    Finished,
    is_miss,
    observe,
    tick,
)
from steersman.control.core.settings import ControllerSettings

CFG = ControllerSettings(adjust_every=1000, recover_hits=5)  # compensation left alone here
HIT = Finished("chat", scheduled=100, corrected=80, actual=100)
MISS = Finished("chat", scheduled=300, corrected=250, actual=100)


def run(script, config=CFG):
    """Feed (time, 'hit' | 'miss' | 'tick') steps; return the modes after each and all events."""
    state = ControllerState()
    modes, events, hot = [], [], []
    for t, what in script:
        if what == "tick":
            step = tick(state, t, config)
        else:
            step = observe(state, HIT if what == "hit" else MISS, t, config)
        state = step.state
        modes.append(state.mode)
        events.extend((t, e.from_mode, e.to_mode, e.reason) for e in step.events)
        hot.append(step.hot_update)
    return modes, events, hot, state


N, F = "NORMAL", "FALLBACK"


@pytest.mark.parametrize(
    ("script", "modes", "events"),
    [
        pytest.param(
            [(t, "miss") for t in range(4)] + [(4, "hit")],
            [N] * 5,
            [],
            id="4 misses then a hit: no fallback",
        ),
        pytest.param(
            [(t, "miss") for t in range(5)],
            [N] * 4 + [F],
            [(4, N, F, "5 consecutive misses over 30%")],
            id="5 misses: fallback",
        ),
        pytest.param(
            [(t, "miss") for t in range(5)] + [(63.9, "tick"), (64, "tick")],
            [N] * 4 + [F, F, N],
            [(4, N, F, "5 consecutive misses over 30%"), (64, F, N, "fallback ended after 60 s")],
            id="60 s: back to normal",
        ),
        pytest.param(
            [(t, "miss") for t in range(5)] + [(10 + t, "hit") for t in range(5)],
            [N] * 4 + [F] * 5 + [N],
            [
                (4, N, F, "5 consecutive misses over 30%"),
                (14, F, N, "shadow predictions recovered: 5 hits in a row"),
            ],
            id="shadow predictions recover early",
        ),
        pytest.param(
            [(t, "miss") for t in range(5)]
            + [(10, "hit"), (11, "hit"), (12, "miss"), (13, "hit"), (20, "miss")]
            + [(70, "miss")],
            [N] * 4 + [F] * 6 + [N],
            [
                (4, N, F, "5 consecutive misses over 30%"),
                (70, F, N, "fallback ended after 60 s"),
            ],
            id="a shadow miss restarts recovery; expiry still applies",
        ),
        pytest.param(
            [(t, "miss") for t in range(3)] + [(3, "hit")] + [(4 + t, "miss") for t in range(4)],
            [N] * 8,
            [],
            id="a hit resets the streak",
        ),
    ],
)
def test_transitions(script, modes, events):
    got_modes, got_events, _, _ = run(script)
    assert got_modes == modes
    assert got_events == events


def test_fallback_asks_for_a_hot_update_once():
    _, _, hot, state = run([(t, "miss") for t in range(8)])
    assert hot == [False] * 4 + [True] + [False] * 3
    assert state.fallbacks == 1


def test_fallback_can_be_disabled():
    config = ControllerSettings(adjust_every=1000, enabled=False)
    modes, events, _, state = run([(t, "miss") for t in range(12)], config)
    assert modes == [N] * 12 and events == [] and state.streak == 12


@pytest.mark.parametrize(
    ("scheduled", "actual", "max_tokens", "miss"),
    [
        (130, 100, None, False),
        (70, 100, None, False),
        (69, 100, None, True),
        (131, 100, None, True),
        (5000, 256, 256, False),  # cut off at max_tokens: the true length is unknown above
        (100, 256, 256, True),
        (1, 0, None, True),
    ],
)
def test_is_miss(scheduled, actual, max_tokens, miss):
    assert is_miss(scheduled, actual, max_tokens, 0.3) is miss


def test_compensation_moves_towards_actual_lengths_within_bounds():
    config = ControllerSettings(adjust_every=10, window=10, headroom=0.1, step=0.5)
    state = ControllerState()
    events = []
    # The corrected prediction is twice the truth: 1.2 * 200 + 10 = 250 scheduled for 100.
    for t in range(60):
        scheduled = state.compensation_for("code", config).apply(200)
        step = observe(state, Finished("code", scheduled, 200, 100), float(t), config)
        state = step.state
        events.extend(e for e in step.events if e.kind == "compensation")
    comp = state.compensation["code"]
    assert len(events) >= 3
    assert comp.a < 1.2 and comp.b < 10  # both scaled down
    assert not is_miss(comp.apply(200), 100, None, 0.3)  # the misses stopped
    assert 100 < comp.apply(200) < 125  # about headroom above the truth
    assert comp.a >= config.a_min
    assert events[0].details["previous_a"] == 1.2
    assert state.compensation_for("chat", config) == Compensation(1.2, 10.0)


def test_compensation_bounds_hold():
    config = ControllerSettings(adjust_every=5, window=5, a_min=0.9, a_max=1.5, b_max=20)
    state = ControllerState()
    for t in range(200):  # predictions far too short: a would grow without bound
        state = observe(state, Finished("chat", 10, 8, 1000), float(t), config).state
    assert state.compensation["chat"].a == 1.5
    assert state.compensation["chat"].b == 20


def test_censored_outcomes_do_not_move_compensation():
    config = ControllerSettings(adjust_every=5)
    state = ControllerState()
    for t in range(50):
        state = observe(
            state, Finished("chat", 900, 800, 64, max_tokens=64), float(t), config
        ).state
    assert state.compensation == {}
    assert state.streak == 0  # and they are not misses either


def feed(outcomes, config=CFG):
    """Feed (time, outcome) pairs; return the modes after each and the mode events' reasons."""
    state, modes, reasons = ControllerState(), [], []
    for t, outcome in outcomes:
        step = observe(state, outcome, t, config)
        state = step.state
        modes.append(state.mode)
        reasons.extend(e.reason for e in step.events if e.kind == "mode")
    return modes, reasons


def at(outcome: Finished, rank: float | None = None, n: int = 0) -> Finished:
    return replace(outcome, rank=rank, modelled=n > 0)


def test_a_model_that_stops_ranking_falls_back_and_stays_until_it_ranks_again():
    config = ControllerSettings(adjust_every=1000, recover_hits=5, rank_window=10)
    enter = [(0.0, at(HIT, 0.5, 10)), (1.0, at(HIT, 0.1, 10))]
    # Hits in shadow (a band fits anything), but the window that started over is not full...
    refill = [(2.0 + t, at(HIT, None, t + 1)) for t in range(9)]
    # ... then full, ranking poorly; then clearly (three times the bar) again.
    poor = [(11.0, at(HIT, 0.2, 10))]
    good = [(12.0, at(HIT, 0.6, 10))]
    modes, reasons = feed(enter + refill + poor + good, config)
    assert modes == [N, F] + [F] * 9 + [F, N]
    assert reasons == [
        "predictions no longer rank: correlation 0.10 below 0.15",
        "shadow predictions recovered: 11 hits in a row",
    ]


def test_without_a_length_model_shadow_hits_end_fallback_early():
    modes, reasons = feed([(float(t), MISS) for t in range(5)] + [
        (10.0 + t, HIT) for t in range(5)
    ])  # fmt: skip
    assert modes == [N] * 4 + [F] * 5 + [N]
    assert reasons[-1] == "shadow predictions recovered: 5 hits in a row"


def test_the_ranking_check_can_be_turned_off():
    config = ControllerSettings(adjust_every=1000, min_rank=0)
    modes, reasons = feed([(float(t), at(HIT, rank=0.0, n=10)) for t in range(20)], config)
    assert modes == [N] * 20 and reasons == []
