"""The scheduling core's intake: what a request is predicted from as it arrives."""

from __future__ import annotations

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
