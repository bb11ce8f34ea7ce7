"""Workloads with shared prefixes: the hashed Mooncake trace and multi-turn conversations."""

from __future__ import annotations

import gzip
import json

from steersman.control.core.prefix import block_hashes
from steersman.control.harness.prefix import (
    MOONCAKE_BLOCK,
    arrival_trace,
    conversations,
    load_hashed_trace,
    mooncake_items,
    work_items,
)
from steersman.control.training.bundled import bundled_records
from steersman.data import path
from steersman.learners.features import conversation_text
from steersman.learners.tokens import TokenCounter


def test_the_bundled_hashed_trace_loads_whole_and_reuses_blocks():
    trace = load_hashed_trace(path("mooncake_hashes"))
    assert len(trace.rows) > 1000 and trace.skipped == []
    refs = [h for row in trace.rows for h in row.hash_ids]
    repeats = len(refs) - len(set(refs))
    assert 0.3 < repeats / len(refs) < 0.45  # the data README: 36.6% of references repeat


def test_bad_lines_are_skipped_and_counted_with_their_line_numbers(tmp_path):
    good = {"arrival_s": 0.0, "input_tokens": 700, "output_tokens": 5, "hash_ids": [1, 2]}
    lines = [
        json.dumps(good),
        json.dumps({**good, "input_tokens": -3}),
        json.dumps({**good, "hash_ids": [1, "x"]}),
        json.dumps({k: v for k, v in good.items() if k != "output_tokens"}),
        "{not json",
        json.dumps([1, 2]),
        json.dumps({**good, "arrival_s": 1.0}),
    ]
    file = tmp_path / "t.jsonl.gz"
    with gzip.open(file, "wt") as fh:
        fh.write("\n".join(lines) + "\n")
    trace = load_hashed_trace(file)
    assert [r.line for r in trace.rows] == [1, 7]
    assert [line for line, _ in trace.skipped] == [2, 3, 4, 5, 6]
    assert "input_tokens" in trace.skipped[0][1] and "hash_ids" in trace.skipped[1][1]


def test_mooncake_items_scale_blocks_and_refuse_what_overflows_the_window():
    trace = load_hashed_trace(path("mooncake_hashes"))
    items, refused = mooncake_items(trace, 200, block_tokens=16, max_model_len=1024, tokens=True)
    assert refused and len(items) + len(refused) <= 200
    for item, row in zip(
        items[:20], [r for r in trace.rows if r.line not in refused], strict=False
    ):
        assert item.prompt_tokens + item.output_tokens <= 1024
        # every hash id but the last is one full block of 16 tokens
        assert (len(row.hash_ids) - 1) * 16 < item.prompt_tokens <= len(row.hash_ids) * 16
        assert len(item.token_ids) == item.prompt_tokens
    # the same hash id, the same tokens: a prefix cache sees the trace's reuse
    by_first: dict[int, tuple[int, ...]] = {}
    for item in items:
        seen = by_first.setdefault(item.prefix[0], item.token_ids[:16])
        assert seen == item.token_ids[:16]
    assert MOONCAKE_BLOCK == 512


def test_each_turn_of_a_conversation_resends_its_history(tiny_model):
    counter = TokenCounter(tiny_model)
    items = conversations(
        bundled_records(), counter, count=3, turns=3, think_s=5.0, max_model_len=4096, seed=1
    )
    assert len(items) >= 6
    chats = [i for i in items if len(i.messages) > 2]
    later = chats[0]
    earlier = next(
        i for i in items if i.messages == later.messages[: len(i.messages)] and i is not later
    )
    ids = counter.ids(conversation_text(messages=later.messages))
    assert len(ids) == later.prompt_tokens
    # the earlier turn's whole prompt is a prefix of the later one's, block for block
    shared = block_hashes(earlier.prefix, 16, earlier.prompt_tokens, 16)
    assert (
        shared and shared == block_hashes(later.prefix, 16, later.prompt_tokens, 16)[: len(shared)]
    )
    replay = work_items(items, "multiturn", rate=2.0)
    assert [w.messages for w in replay] == [i.messages for i in items]
    assert abs(len(replay) / replay[-1].arrival_s - 2.0) < 0.01


def test_the_arrivals_of_a_bucket_are_spread_across_it():
    trace = load_hashed_trace(path("mooncake_hashes"))
    plain = arrival_trace(trace)
    times = [r.arrival_s for r in plain.rows]
    assert times == sorted(times) and len(times) == len(trace.rows)
    assert len(set(times)) > 0.9 * len(times)
