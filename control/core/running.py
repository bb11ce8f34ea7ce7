"""Every request steersman has at an instance, kept as vectors (instance, request class, scheduled
length, tokens produced, prompt length), so a decision over a thousand requests in flight and many
instances costs a handful of array operations instead of a Python loop per request.

>>> f = InFlight(["a", "b"])
>>> f.add("r1", "a", scheduled=100.0, prompt=20)
>>> f.add("r2", "a", scheduled=10.0, prompt=5)
>>> f.add("r3", "b", scheduled=40.0, prompt=8)
>>> f.progress("r1", 30)
>>> f.progress("r2", 12)  # past its prediction: at least a tenth of it (and a token) is left
>>> f.remaining_of("a").tolist(), f.count("a")
([70.0, 1.0], 2)
>>> f.shared(50.0).tolist()  # per instance: the steps a newcomer of 50 tokens shares
[51.0, 40.0]
>>> f.prefilling().tolist()  # per instance: prompt tokens of requests with no token yet
[0.0, 8.0]
>>> f.remove("r1")
'a'
>>> f.count("a"), f.produced_of("a")
(1, {'r2': 12})
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np

from steersman.learners.remaining import RemainingLength, remaining

_COLUMNS = ("inst", "cls", "scheduled", "produced", "prompt", "priority")  # one row per request


class InFlight:
    def __init__(self, instances: Iterable[str] = (), capacity: int = 256) -> None:
        self.index: dict[str, int] = {}
        self.names: list[str] = []
        self.counts: list[int] = []
        for name in instances:
            self.instance(name)
        self.ids: list[str] = []
        self._slot: dict[str, int] = {}
        self.classes: list[str] = []
        self.inst = np.zeros(capacity, dtype=np.intp)
        self.cls = np.zeros(capacity, dtype=np.intp)
        self.scheduled = np.zeros(capacity)
        self.produced = np.zeros(capacity)
        self.prompt = np.zeros(capacity)
        self.priority = np.zeros(capacity)  # vLLM's priority it was sent with (lower first)

    def instance(self, name: str) -> int:
        """The instance's index (instances are numbered as they are first seen)."""
        k = self.index.get(name)
        if k is None:
            k = self.index[name] = len(self.counts)
            self.names.append(name)
            self.counts.append(0)
        return k

    def __len__(self) -> int:
        return len(self.ids)

    def count(self, name: str) -> int:
        k = self.index.get(name)
        return 0 if k is None else self.counts[k]

    def add(
        self,
        rid: str,
        name: str,
        scheduled: float,
        prompt: int,
        request_class: str = "other",
        priority: int = 0,
    ) -> None:
        n = len(self.ids)
        if n == len(self.scheduled):
            for attr in _COLUMNS:
                old = getattr(self, attr)
                grown = np.zeros(2 * n, dtype=old.dtype)
                grown[:n] = old
                setattr(self, attr, grown)
        k = self.instance(name)
        self._slot[rid] = n
        self.ids.append(rid)
        if request_class not in self.classes:
            self.classes.append(request_class)
        self.inst[n], self.cls[n] = k, self.classes.index(request_class)
        self.scheduled[n], self.produced[n], self.prompt[n] = scheduled, 0, prompt
        self.priority[n] = priority
        self.counts[k] += 1

    def remove(self, rid: str) -> str | None:
        """Free the request's slot (the last request moves into it); the instance it was at."""
        j = self._slot.pop(rid, None)
        if j is None:
            return None
        k = int(self.inst[j])
        self.counts[k] -= 1
        last = len(self.ids) - 1
        moved = self.ids.pop()
        if j != last:
            self.ids[j] = moved
            self._slot[moved] = j
            for attr in _COLUMNS:
                getattr(self, attr)[j] = getattr(self, attr)[last]
        return self.names[k]

    def progress(self, rid: str, produced: int) -> None:
        j = self._slot.get(rid)
        if j is not None:
            self.produced[j] = produced

    def remaining(self, learned: RemainingLength | None = None) -> np.ndarray:
        """Expected output tokens left per request, refined with what each produced so far by
        the ``learned`` distribution of its class (see ``learners.remaining``); without one, the
        prediction less what was produced, but at least a tenth of it and one token."""
        n = len(self.ids)
        s, g = self.scheduled[:n], self.produced[:n]
        out = remaining(s, g, None)
        if learned is not None:
            cls = self.cls[:n]
            for c, name in enumerate(self.classes):
                table = learned.table(name)
                if table is not None:
                    mine = cls == c
                    out[mine] = remaining(s[mine], g[mine], table)
        return out

    def size(self) -> np.ndarray:
        """The tokens each request holds now: prompt and what it produced."""
        n = len(self.ids)
        return self.prompt[:n] + self.produced[:n]

    def remaining_of(self, name: str) -> np.ndarray:
        k = self.index.get(name)
        if k is None:
            return np.zeros(0)
        return self.remaining()[self.inst[: len(self.ids)] == k]

    def shared(self, length: float, left: np.ndarray | None = None) -> np.ndarray:
        """Per instance (by index): ``sum(min(remaining, length))``, the decode steps a newcomer
        of ``length`` tokens would share with the requests already there (``left``: their
        remaining lengths, when already computed)."""
        n = len(self.ids)
        weights = np.minimum(self.remaining() if left is None else left, length)
        return np.bincount(self.inst[:n], weights=weights, minlength=len(self.counts))

    def prefilling(self) -> np.ndarray:
        """Per instance (by index): prompt tokens of its requests that have produced nothing
        yet, the prefill work a newcomer's first token waits behind."""
        n = len(self.ids)
        waiting = self.prompt[:n] * (self.produced[:n] == 0)
        return np.bincount(self.inst[:n], weights=waiting, minlength=len(self.counts))

    def produced_of(self, name: str) -> dict[str, int]:
        k = self.index.get(name)
        return {
            rid: int(self.produced[j])
            for rid, j in self._slot.items()
            if k is not None and self.inst[j] == k
        }
