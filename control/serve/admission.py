"""steersman's own queue: requests wait here, ordered by priority key, until an instance has room.

Instances have concurrency caps, so under load the backlog queues where predictions can order
it instead of piling up blindly in vLLM. ``claim(job)`` (the service's dispatch decision, which
also takes the slot) names an instance or None; ``release(job, name)`` gives a slot back;
``pump()`` runs after every release.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any


class QueueFull(Exception):
    """More requests are waiting than ``max_queue``."""


class QueueTimeout(Exception):
    """No instance had room within the queue timeout."""


@dataclass(order=True)
class _Waiter:
    key: float
    seq: int
    job: Any = field(compare=False)
    future: asyncio.Future[str] = field(compare=False)


class Admission:
    def __init__(
        self,
        claim: Callable[[Any], str | None],
        release: Callable[[Any, str], None],
        max_queue: int = 10_000,
    ) -> None:
        self._claim = claim
        self._release = release
        self.max_queue = max_queue
        self._heap: list[_Waiter] = []
        self._seq = itertools.count()

    @property
    def depth(self) -> int:
        return sum(1 for w in self._heap if not w.future.done())

    async def acquire(self, job: Any, key: float, timeout_s: float) -> str:
        """The instance this job may run on; its slot is taken. Raises QueueFull or QueueTimeout."""
        if not self._heap:
            name = self._claim(job)
            if name is not None:
                return name
        if self.depth >= self.max_queue:
            raise QueueFull(f"{self.depth} requests already waiting")
        future: asyncio.Future[str] = asyncio.get_running_loop().create_future()
        heapq.heappush(self._heap, _Waiter(key, next(self._seq), job, future))
        self.pump()
        try:
            return await asyncio.wait_for(asyncio.shield(future), timeout_s)
        except (TimeoutError, asyncio.CancelledError) as exc:
            if future.done() and not future.cancelled() and future.exception() is None:
                granted = future.result()
                if isinstance(exc, TimeoutError):
                    return granted  # granted as the timer fired: use it
                self._release(job, granted)  # granted to a caller that left: give it back
                self.pump()
            else:
                future.cancel()  # lazily dropped from the heap
            if isinstance(exc, TimeoutError):
                raise QueueTimeout(f"no instance had room within {timeout_s:g} s") from None
            raise

    def pump(self) -> None:
        """Hand free slots to the waiters at the head, best key first."""
        while self._heap:
            head = self._heap[0]
            if head.future.done():
                heapq.heappop(self._heap)
                continue
            name = self._claim(head.job)
            if name is None:
                return
            heapq.heappop(self._heap)
            head.future.set_result(name)
