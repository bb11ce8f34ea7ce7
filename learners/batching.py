"""Micro-batched inference: requests gathered for a couple of milliseconds, run together on one
worker thread, answered through futures; a caller that cannot wait gets None by its deadline."""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import math
import queue
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

log = logging.getLogger(__name__)


class Estimate(NamedTuple):
    """A model's answer for one text: its value and, from a model that has one, the text's
    vector (what the similar-prompt prior compares)."""

    value: float
    vector: Any = None


# Per text, a value or an Estimate.
PredictBatch = Callable[[list[str]], Sequence[float | Estimate]]


@dataclass
class BatcherStats:
    batches: int = 0
    items: int = 0
    late: int = 0  # answers that missed their caller's deadline
    failed: int = 0
    invalid: int = 0  # NaN or infinite outputs


class MicroBatcher:
    """``await batcher.predict(text, deadline_s)`` -> the model's ``Estimate``, or None when it
    is not ready in time (the caller then uses its fast path and flags the request).

    One worker thread owns the model, so the event loop never blocks on inference and the model
    needs no locking; ``swap`` replaces the model between two batches, dropping nothing.
    """

    def __init__(
        self, predict_batch: PredictBatch, *, max_batch: int = 32, max_wait_s: float = 0.002
    ) -> None:
        self._predict = predict_batch
        self.max_batch = max_batch
        self.max_wait_s = max_wait_s
        self.stats = BatcherStats()
        self._queue: queue.Queue[tuple[str, concurrent.futures.Future[Estimate]] | None] = (
            queue.Queue()
        )
        self._thread = threading.Thread(target=self._run, name="micro-batcher", daemon=True)
        self._thread.start()

    def submit(self, text: str) -> concurrent.futures.Future[Estimate]:
        future: concurrent.futures.Future[Estimate] = concurrent.futures.Future()
        self._queue.put((text if isinstance(text, str) else "", future))
        return future

    async def predict(self, text: str, deadline_s: float) -> Estimate | None:
        future = self.submit(text)
        try:
            return await asyncio.wait_for(asyncio.wrap_future(future), timeout=deadline_s)
        except TimeoutError:
            self.stats.late += 1
            return None
        except Exception:
            return None  # counted in stats.failed by the worker

    def swap(self, predict_batch: PredictBatch) -> None:
        """Serve the next batch with a new model (a hot swap)."""
        self._predict = predict_batch

    def close(self) -> None:
        self._queue.put(None)
        self._thread.join()

    def _run(self) -> None:
        while True:
            first = self._queue.get()
            if first is None:
                return
            batch = [first]
            until = time.monotonic() + self.max_wait_s
            while len(batch) < self.max_batch:
                left = until - time.monotonic()
                try:
                    item = (
                        self._queue.get(timeout=max(left, 0.0))
                        if left > 0
                        else (self._queue.get_nowait())
                    )
                except queue.Empty:
                    break
                if item is None:
                    self._queue.put(None)  # finish this batch, then stop
                    break
                batch.append(item)
            self._answer(batch)

    def _answer(self, batch: list[tuple[str, concurrent.futures.Future[Estimate]]]) -> None:
        live = [(t, f) for t, f in batch if f.set_running_or_notify_cancel()]
        if not live:
            return
        try:
            values = list(self._predict([t for t, _ in live]))
            if len(values) != len(live):
                raise ValueError(f"model returned {len(values)} values for {len(live)} texts")
        except Exception as exc:
            self.stats.failed += len(live)
            log.exception("batched prediction failed")
            for _, future in live:
                future.set_exception(exc)
            return
        self.stats.batches += 1
        self.stats.items += len(live)
        for (_, future), value in zip(live, values, strict=True):
            answer = value if isinstance(value, Estimate) else Estimate(float(value))
            if not math.isfinite(answer.value):
                self.stats.invalid += 1
            future.set_result(answer)
