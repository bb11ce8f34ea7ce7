"""Prompt prefixes as chains of block hashes, and what an instance is likely to hold of them.

A prompt is described by its *segments*: fixed-size runs of tokens, each named by a hash that
identifies the whole prompt up to and including it (a chain: two prompts that share a segment hash
at a position share everything before it). A KV cache works in blocks of its own size: block ``j``
of a prompt covers tokens ``[j*b, (j+1)*b)`` and is identified by the segment that holds its last
token and where in it that token is. Blocks are told apart exactly when they hold whole
segments (a block smaller than a segment is known only as the segment it is in): tokenized
prompts use small segments.

>>> a = block_hashes(chain([[1, 2], [3, 4], [5, 6], [7, 8], [9]]), 2, 9, block=4)
>>> b = block_hashes(chain([[1, 2], [3, 4], [5, 6], [0, 0]]), 2, 8, block=4)
>>> len(a), a[0] == b[0], a[1] == b[1]  # two full blocks; the prompts part in the second
(2, True, False)
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable, Sequence

SEGMENT_TOKENS = 16  # tokens a segment of a tokenized prompt (the smallest KV block size)


def chain(pieces: Iterable[Sequence[int]]) -> tuple[int, ...]:
    """Chained hashes of successive token runs (each names everything up to it)."""
    out, parent = [], 0
    for piece in pieces:
        parent = hash((parent, tuple(piece)))
        out.append(parent)
    return tuple(out)


def block_hashes(
    segments: Sequence[int], segment_tokens: int, prompt_tokens: int, block: int
) -> tuple[int, ...]:
    """The hashes of a prompt's full KV blocks of ``block`` tokens."""
    full = min(prompt_tokens, len(segments) * segment_tokens) // block
    out = []
    for j in range(full):
        last = (j + 1) * block - 1
        out.append(hash((segments[last // segment_tokens], last % segment_tokens)))
    return tuple(out)


def token_segments(token_ids: Sequence[int], segment_tokens: int) -> tuple[int, ...]:
    """A tokenized prompt's segments (the last one may be partial)."""
    return chain(
        token_ids[k : k + segment_tokens] for k in range(0, len(token_ids), segment_tokens)
    )


class PrefixIndex:
    """The blocks an instance is likely to hold: those of the prompts sent there, least recently
    used first out once more than ``capacity`` blocks are remembered (vLLM keeps freed blocks
    cached until it needs the room, and evicts the least recently used).

    >>> index = PrefixIndex(capacity=3)
    >>> index.touch((1, 2))
    >>> index.cached((1, 2, 9))  # blocks of a new prompt already there: its cached prefix
    2
    >>> index.touch((5, 6))  # over capacity: block 1, the oldest, is forgotten
    >>> index.cached((1, 2)), index.cached((5, 6))
    (0, 2)
    """

    def __init__(self, capacity: int) -> None:
        self.capacity = max(capacity, 0)
        self._lru: OrderedDict[int, None] = OrderedDict()

    def __len__(self) -> int:
        return len(self._lru)

    def cached(self, blocks: Sequence[int]) -> int:
        """How many leading blocks of ``blocks`` are remembered."""
        n = 0
        for h in blocks:
            if h not in self._lru:
                break
            n += 1
        return n

    def touch(self, blocks: Sequence[int]) -> None:
        """A prompt went there: its blocks are now the most recently used."""
        lru = self._lru
        for h in blocks:
            lru[h] = None
            lru.move_to_end(h)
        while len(lru) > self.capacity:
            lru.popitem(last=False)

    def resize(self, capacity: int) -> None:
        self.capacity = max(capacity, 0)
        while len(self._lru) > self.capacity:
            self._lru.popitem(last=False)
