"""Fragmentation, defined once, as pure functions of what the sources report.

- KV cache of a vLLM instance: the share of allocated KV-cache slots that hold no token,
  ``1 - tokens_held / (allocated_blocks * block_size)``. vLLM allocates paged blocks of
  ``block_size`` token slots; the last block of every sequence is partly empty, and blocks
  allocated ahead of decoding are empty, so this is the memory paged attention cannot use.
  ``allocated_blocks = kv_cache_usage * num_gpu_blocks`` from the instance's /metrics;
  ``tokens_held`` is the prompt plus generated tokens of the requests running there.
- In-process PyTorch allocator: ``1 - allocated / reserved`` from ``torch.cuda.memory_stats()``
  (bytes the caching allocator holds from the driver but no tensor uses).
"""

from __future__ import annotations

from collections.abc import Mapping


def kv_fragmentation(allocated_blocks: float, block_size: int, tokens_held: float) -> float | None:
    """Share of allocated KV slots holding no token; None when nothing is allocated.

    >>> kv_fragmentation(allocated_blocks=4, block_size=16, tokens_held=48)
    0.25
    >>> kv_fragmentation(0, 16, 0) is None
    True
    """
    slots = allocated_blocks * block_size
    if not slots > 0:
        return None
    return min(1.0, max(0.0, 1.0 - tokens_held / slots))


def allocator_fragmentation(memory_stats: Mapping[str, float]) -> float | None:
    """``1 - allocated/reserved`` from a ``torch.cuda.memory_stats()`` dict; None if unreserved.

    >>> allocator_fragmentation({"allocated_bytes.all.current": 3 << 30,
    ...                          "reserved_bytes.all.current": 4 << 30})
    0.25
    """
    reserved = memory_stats.get("reserved_bytes.all.current", 0)
    if not reserved > 0:
        return None
    allocated = memory_stats.get("allocated_bytes.all.current", 0)
    return min(1.0, max(0.0, 1.0 - allocated / reserved))
