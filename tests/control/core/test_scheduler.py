"""The scheduling core's intake: what a request is predicted from as it arrives."""

from __future__ import annotations

import pytest

from steersman.control.core.scheduler import Arrival, Scheduler
from steersman.control.core.settings import ControllerSettings, DispatchSettings
from steersman.learners.corrector import BASE_KEY, VECTOR_KEY, LengthCorrector


def test_a_request_is_predicted_with_what_similar_earlier_prompts_produced():
    corrector = LengthCorrector()
    for _ in range(60):  # the base model says 100 for both kinds of prompt
        corrector.learn_one({BASE_KEY: 100.0, VECTOR_KEY: [1.0, 0.0]}, 1000)
        corrector.learn_one({BASE_KEY: 100.0, VECTOR_KEY: [0.0, 1.0]}, 10)
    s = Scheduler(DispatchSettings(policy="least-load"), ControllerSettings(enabled=False),
                  corrector=corrector)  # fmt: skip
    long = s.add(Arrival("long", 10, {BASE_KEY: 100.0, VECTOR_KEY: [1.0, 0.1]}), now=0.0)
    short = s.add(Arrival("short", 10, {BASE_KEY: 100.0, VECTOR_KEY: [0.1, 1.0]}), now=0.0)
    unknown = s.add(Arrival("unknown", 10, {BASE_KEY: 100.0}), now=0.0)
    assert long.corrected > 3 * unknown.corrected > 9 * short.corrected


@pytest.mark.parametrize(
    ("unordered_size", "length", "ahead"),
    [
        pytest.param("zero", 12, True, id="zero: ahead of a short ordered one"),
        pytest.param("zero", 1000, True, id="zero: ahead of a long ordered one"),
        pytest.param("typical", 12, False, id="typical: behind a short ordered one"),
        pytest.param("typical", 1000, True, id="typical: ahead of a long ordered one"),
    ],
)
def test_a_request_outside_the_length_order_ranks_as_set(unordered_size, length, ahead):
    s = Scheduler(DispatchSettings(policy="least-load", unordered_size=unordered_size),
                  ControllerSettings(enabled=False))  # fmt: skip
    for k, tokens in enumerate((30.0, 60.0, 120.0, 240.0)):  # scheduled: 1.2 x + 10
        s.add(Arrival(f"earlier{k}", 10, {BASE_KEY: tokens}), now=0.0)
    t = s.add(Arrival("ordered", 10, {BASE_KEY: (length - 10) / 1.2}), now=1.0)
    assert t.scheduled == length
    assert (t.arrival_priority < t.priority) is ahead  # the same arrival, outside the order
