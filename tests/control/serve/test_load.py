"""The load watcher: each read of the instances' load also re-reads their latency models, on
the service's clock."""

import asyncio

import httpx
import pytest

from steersman.control.serve.instances import make_instance
from steersman.control.serve.load import LoadWatcher
from steersman.control.serve.sections import GatewaySettings, InstanceSettings
from steersman.telemetry.settings import TelemetrySettings


def watched(now: list[float]):
    instance = make_instance(InstanceSettings(sim="a100-llama2-7b"), GatewaySettings(), None)
    rows: list[dict] = []

    async def step() -> None:
        async with httpx.AsyncClient() as client:
            watcher = LoadWatcher(
                [instance], client, TelemetrySettings(), sink=rows.append,
                in_flight=lambda _: 0, clock=lambda: now[0],
            )  # fmt: skip
            await watcher.step()

    return instance, rows, step


def test_a_slow_judgment_fades_on_the_services_clock_while_the_instance_finishes_nothing():
    now = [1000.0]
    instance, rows, step = watched(now)
    prior = instance.latency.prior.step(1)
    for _ in range(50):  # it ran twice as slow as profiled, last at t = 1000
        instance.latency.learn_one({"running": 1}, 2 * prior, now=1000.0)
    asyncio.run(step())
    assert instance.coefficients is not None
    assert instance.coefficients.step(1) == pytest.approx(2 * prior, rel=0.01)
    assert rows and rows[0]["step_s"] == pytest.approx(2 * prior, rel=0.01)
    now[0] = 1000.0 + 30 + 15 * 20  # twenty half-lives past the grace: the profile again
    asyncio.run(step())
    assert instance.coefficients.step(1) == pytest.approx(prior, rel=1e-3)
    assert instance.latency.state(now[0])["trust"] < 1e-5
