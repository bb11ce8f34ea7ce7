"""steersman's scheduler class inside real vLLM CPU servers: the waiting queue is ordered by
predicted length, and a KV-starved server preempts the request with the longest predicted
remaining length."""

from __future__ import annotations

import asyncio
import itertools
import random
import subprocess
import time

import httpx
import pytest

from steersman.control.backends.vllm_server import VllmServer, free_port
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
            server.wait_healthy(timeout_s=240)
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
    client: httpx.AsyncClient, url: str, tokens: int, predicted: int, rng: random.Random
) -> list[float]:
    """One request (its own prompt, so no prefix is shared); the arrival time of each token."""
    body = {
        "model": "tiny",
        "prompt": [rng.randrange(7, 1000) for _ in range(16)],
        "max_tokens": tokens,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True, "continuous_usage_stats": True},
        "vllm_xargs": {"steersman_predicted_tokens": predicted},
    }
    times: list[float] = []
    async with client.stream("POST", f"{url}/v1/completions", json=body) as response:
        assert response.status_code == 200
        async for line in response.aiter_lines():
            if line.startswith("data: {") and '"text"' in line:
                times.append(time.monotonic())
    return times


def test_the_waiting_queue_serves_the_shortest_prediction_first(servers):
    url = servers[0].url
    rng = random.Random(1)

    async def main() -> list[str]:
        finished: list[str] = []
        async with httpx.AsyncClient(timeout=300) as client:

            async def one(name: str, tokens: int, delay: float) -> None:
                await asyncio.sleep(delay)
                await _generate(client, url, tokens, tokens, rng)
                finished.append(name)

            # The blocker takes the one slot; two long requests, then two short ones, wait.
            await asyncio.gather(
                one("blocker", 200, 0.0),
                one("long-1", 120, 0.2),
                one("long-2", 120, 0.25),
                one("short-1", 4, 0.3),
                one("short-2", 4, 0.35),
            )
        return finished

    finished = asyncio.run(main())
    assert finished[0] == "blocker"
    assert set(finished[1:3]) == {"short-1", "short-2"}, finished
    assert set(finished[3:]) == {"long-1", "long-2"}, finished


def test_a_kv_starved_server_preempts_the_longest_predicted_remaining(servers):
    url = servers[1].url
    rng = random.Random(2)

    async def main() -> dict[str, list[float]]:
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

    runs = asyncio.run(main())
    assert all(len(t) == 400 for t in runs.values())
    stall = {name: max(b - a for a, b in itertools.pairwise(t)) for name, t in runs.items()}
    ended = {name: t[-1] for name, t in runs.items()}
    assert max(stall, key=stall.__getitem__) == "long", stall  # recomputed after the others
    assert max(ended, key=ended.__getitem__) == "long", ended
