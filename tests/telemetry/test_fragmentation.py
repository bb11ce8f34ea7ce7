"""Fragmentation as defined in steersman.telemetry.fragmentation."""

from __future__ import annotations

import pytest

from steersman.telemetry.fragmentation import allocator_fragmentation, kv_fragmentation


@pytest.mark.parametrize(
    ("blocks", "block_size", "tokens", "expected"),
    [
        (10, 16, 160, 0.0),  # every slot holds a token
        (10, 16, 150, 10 / 160),  # a partly filled last block
        (0.5 * 2000, 16, 8000, 0.5),  # kv usage 50% of 2000 blocks, half the slots in use
        (4, 16, 100, 0.0),  # more tokens than slots (stale counts): clamped
        (0, 16, 0, None),
    ],
)
def test_kv_fragmentation(blocks, block_size, tokens, expected):
    got = kv_fragmentation(blocks, block_size, tokens)
    assert got == (None if expected is None else pytest.approx(expected))


def test_allocator_fragmentation():
    stats = {"allocated_bytes.all.current": 6 << 30, "reserved_bytes.all.current": 8 << 30}
    assert allocator_fragmentation(stats) == pytest.approx(0.25)
    assert allocator_fragmentation({}) is None
