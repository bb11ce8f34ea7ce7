"""vLLM's automatic prefix caching, as the simulated engine keeps it: full KV blocks named by the
hash of the prompt up to them; a block stays cached while free, until the room is needed, least
recently used first; a new request takes the longest run of its leading blocks that is cached,
and skips their prefill.

>>> cache = PrefixCache()
>>> cache.keep((1, 2, 3))  # a finished request's blocks: free, but cached
3
>>> cache.match((1, 2, 9), limit=3)
[1, 2]
>>> cache.take([1, 2])  # a newcomer holds them now: two blocks leave the free pool
2
>>> cache.evictable, cache.give([1, 2])  # it finishes: they are free and cached again
(1, 2)
>>> cache.evict(2), cache.match((3,), 1)  # the room was needed: 3, the oldest, went first
(2, [])
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable, Sequence


class PrefixCache:
    def __init__(self) -> None:
        self.refs: dict[int, int] = {}  # cached blocks held by requests: how many hold each
        self.free: OrderedDict[int, None] = OrderedDict()  # cached, held by none: evictable
        self.queries = 0  # prompt tokens looked up, as vLLM's counters count them
        self.hits = 0  # of which found cached

    @property
    def evictable(self) -> int:
        return len(self.free)

    def match(self, hashes: Sequence[int], limit: int) -> list[int]:
        """The longest run of leading blocks that is cached (at most ``limit``)."""
        hit = []
        for h in hashes[:limit]:
            if h not in self.refs and h not in self.free:
                break
            hit.append(h)
        return hit

    def take(self, hashes: Iterable[int]) -> int:
        """A request holds these cached blocks; the number that were free (and are not now)."""
        taken = 0
        for h in hashes:
            if h in self.free:
                del self.free[h]
                taken += 1
            self.refs[h] = self.refs.get(h, 0) + 1
        return taken

    def give(self, hashes: Iterable[int]) -> int:
        """A request lets go of these blocks; the number no one holds any more (free now, and
        cached)."""
        freed = 0
        for h in hashes:
            left = self.refs.get(h, 0) - 1
            if left > 0:
                self.refs[h] = left
                continue
            self.refs.pop(h, None)
            self.free[h] = None
            freed += 1
        return freed

    def keep(self, hashes: Iterable[int]) -> int:
        """Blocks a request computed itself and let go of: cached from now on (those whose
        content is cached already are plain free blocks); the number newly cached."""
        kept = 0
        for h in hashes:
            if h in self.refs or h in self.free:
                continue
            self.free[h] = None
            kept += 1
        return kept

    def evict(self, n: int) -> int:
        """Forget the ``n`` least recently used free blocks (their room is needed)."""
        n = min(n, len(self.free))
        for _ in range(n):
            self.free.popitem(last=False)
        return n
