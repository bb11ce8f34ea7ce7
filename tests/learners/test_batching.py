"""Micro-batched inference: batching, deadlines, failures, hot swap."""

from __future__ import annotations

import asyncio
import math
import threading

from steersman.learners.batching import Estimate, MicroBatcher


def test_concurrent_requests_share_batches_and_get_their_own_answers():
    sizes = []

    def model(texts):
        sizes.append(len(texts))
        return [float(len(t)) for t in texts]

    batcher = MicroBatcher(model, max_batch=16, max_wait_s=0.02)

    async def go():
        return await asyncio.gather(*(batcher.predict("x" * i, 5.0) for i in range(40)))

    try:
        answers = asyncio.run(go())
    finally:
        batcher.close()
    assert answers == [Estimate(float(i)) for i in range(40)]
    assert max(sizes) > 1 and max(sizes) <= 16 and sum(sizes) == 40
    assert batcher.stats.items == 40 and batcher.stats.batches == len(sizes)


def test_a_slow_model_misses_the_deadline_and_the_caller_gets_none():
    release = threading.Event()

    def slow(texts):
        release.wait(5)
        return [1.0] * len(texts)

    batcher = MicroBatcher(slow, max_wait_s=0.0)

    async def go():
        return await batcher.predict("hello", deadline_s=0.05)

    try:
        assert asyncio.run(go()) is None
        assert batcher.stats.late == 1
    finally:
        release.set()
        batcher.close()


def test_failures_and_odd_outputs_do_not_raise_to_the_caller():
    def broken(texts):
        raise RuntimeError("CUDA error: device-side assert")

    batcher = MicroBatcher(broken)
    try:
        assert asyncio.run(batcher.predict("x", 5.0)) is None
        assert batcher.stats.failed == 1
        batcher.swap(lambda texts: [math.nan] * len(texts))
        value = asyncio.run(batcher.predict("x", 5.0)).value
        assert math.isnan(value) and batcher.stats.invalid == 1
        batcher.swap(lambda texts: [Estimate(7.0, [1.0])] * len(texts))  # the hot swap
        assert asyncio.run(batcher.predict("x", 5.0)) == Estimate(7.0, [1.0])
    finally:
        batcher.close()
