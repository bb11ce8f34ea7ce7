"""The streamed-QoE rule (core.qoe_rule): what a stream gains from being served, and which streams
are paused and admitted under KV pressure."""

from __future__ import annotations

import math

import pytest

from steersman.control.core.qoe_rule import Stream, decide, gain, reader_lag_area, under_pressure
from steersman.control.core.settings import QoeSettings

RULE = QoeSettings(
    enabled=True,
    horizon_s=2.0,
    protect_s=1.0,
    min_left_tokens=8,
    max_pauses=1,
    predicted_lengths=True,
)
STEP, CHUNK = 0.03, 2048


def running(
    key: str, *, blocks=40, age=20.0, delivered=90, left=200.0, since=15.0, pauses=0
) -> Stream:
    return Stream(key, True, blocks, age, delivered, left, since_start_s=since, pauses=pauses)


def waiting(key: str, *, blocks=30, age=3.0, delivered=0, left=100.0, prompt=400) -> Stream:
    return Stream(key, False, blocks, age, delivered, left, restart_tokens=prompt)


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        pytest.param((0.0, 0, 100, 1.0, 0.2, 2.0), 3.5, id="never served: 1 s behind, growing"),
        pytest.param((0.0, 0, 100, 1.0, 0.2, 0.5), 0.0, id="before the first token is due"),
        pytest.param((10.0, 60, 100, 1.0, 0.2, 2.0), 0.0, id="slack beyond the span"),
        pytest.param((10.0, 100, 100, 1.0, 0.2, 2.0), 0.0, id="all delivered"),
        pytest.param((0.0, 0, 3, 1.0, 0.2, 2.0), 2.6, id="the reader stops at the last token"),
    ],
)
def test_reader_lag_area(args, expected):
    assert reader_lag_area(*args) == pytest.approx(expected, abs=1e-6)


def test_serving_removes_the_lag_it_can():
    paused = reader_lag_area(5.0, 0, 100, 1.0, 0.2, 2.0)
    slow = reader_lag_area(5.0, 0, 100, 1.0, 0.2, 2.0, 0.5, 10.0)
    fast = reader_lag_area(5.0, 0, 100, 1.0, 0.2, 2.0, 0.0, 100.0)
    assert paused > slow > fast >= 0


@pytest.mark.parametrize(
    ("a", "b"),
    [
        pytest.param(waiting("late", age=3.0), waiting("later", age=6.0), id="longer overdue"),
        pytest.param(waiting("long", left=800), waiting("short", left=50), id="shorter answer"),
        pytest.param(
            running("ahead", delivered=150), running("behind", delivered=95), id="less slack"
        ),
    ],
)
def test_gain_orders_who_stalls_first(a, b):
    assert gain(b, STEP, CHUNK, RULE) > gain(a, STEP, CHUNK, RULE) >= 0


def test_without_predicted_lengths_every_stream_has_the_unknown_length():
    rule = RULE.model_copy(update={"predicted_lengths": False})
    short, long = waiting("short", left=20), waiting("long", left=2000)
    assert gain(short, STEP, CHUNK, rule) == gain(long, STEP, CHUNK, rule) > 0
    assert gain(short, STEP, CHUNK, RULE) > gain(long, STEP, CHUNK, RULE)


def test_gain_without_a_prediction_uses_the_unknown_length():
    unknown = waiting("u", left=None)
    as_unknown = waiting("k", left=RULE.unknown_tokens)
    assert gain(unknown, STEP, CHUNK, RULE) == gain(as_unknown, STEP, CHUNK, RULE)


@pytest.mark.parametrize(
    ("kv", "seats", "queue", "expected"),
    [(0.95, 10, 3, True), (0.95, 10, 0, False), (0.5, 256, 1, True), (0.5, 10, 1, False)],
)
def test_under_pressure(kv, seats, queue, expected):
    assert under_pressure(kv, seats, queue, 256, RULE) is expected


def test_pauses_the_stream_furthest_ahead_to_admit_an_overdue_one():
    ahead = running("ahead", delivered=150)
    close = running("close", delivered=91, age=20.0)
    d = decide([close, ahead, waiting("late")], 0, 8, STEP, CHUNK, RULE)
    assert d.pause == ("ahead",)
    assert d.admit == ("late",)


@pytest.mark.parametrize(
    ("streams", "free"),
    [
        pytest.param([running("ahead"), waiting("late")], 30, id="room enough: nobody paused"),
        pytest.param([running("fresh", since=0.5), waiting("late")], 0, id="just restarted"),
        pytest.param([running("ending", left=4), waiting("late")], 0, id="nearly done"),
        pytest.param([running("paused", pauses=1), waiting("late")], 0, id="paused enough"),
        pytest.param(
            [running("behind", delivered=92, left=20), waiting("early", age=0.2)],
            0,
            id="a pause would cost more than the admission gains",
        ),
        pytest.param(
            [running("ahead", blocks=10), waiting("huge", blocks=500)],
            0,
            id="cannot fit even by pausing everyone",
        ),
    ],
)
def test_pauses_nobody(streams, free):
    assert decide(streams, free, 8, STEP, CHUNK, RULE).pause == ()


def test_seats_bind_like_blocks():
    d = decide([running("ahead"), waiting("late")], 1000, 1, STEP, CHUNK, RULE)
    assert (d.pause, d.admit) == (("ahead",), ("late",))


def test_odd_numbers_do_not_raise():
    odd = Stream("odd", False, 0, math.inf, 0, math.nan, restart_tokens=0, pace_s=0.2)
    d = decide([odd, running("ahead")], 0, 8, 0.0, 0, RULE)
    assert set(d.gains) == {"odd", "ahead"}


def test_without_pauses_it_only_orders_admissions():
    rule = RULE.model_copy(update={"max_pauses": 0})
    streams = [running("ahead"), waiting("due-later", age=0.5), waiting("overdue", age=4.0)]
    d = decide(streams, 100, 8, STEP, CHUNK, rule)
    assert d.pause == () and d.admit == ("overdue", "due-later")


def test_a_paused_stream_comes_back_before_new_ones():
    back = waiting("back", age=30.0, delivered=120, prompt=500)  # its reader is reading
    new = waiting("new", age=3.0)
    assert decide([new, back], 100, 8, STEP, CHUNK, RULE).admit == ("back", "new")
