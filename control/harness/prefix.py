"""Workloads that share prefixes: the Mooncake trace with its prefix-block hash ids, and
multi-turn conversations where each turn resends the history.

Mooncake names each 512-token block of a request's input by a hash id (the same id at the same
place: the same prefix). A replay gives every hash id one fixed block of random tokens, so a real
prefix cache sees the trace's reuse; inputs are scaled down to the served model's window with
``block_tokens`` tokens a hash id (the report states it), and a request still over the window is
refused as vLLM would refuse it, never cut short silently.
"""

from __future__ import annotations

import gzip
import itertools
import json
import math
import random
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from steersman.control.core.prefix import SEGMENT_TOKENS, token_segments
from steersman.control.harness.workloads import Trace, TraceRow, WorkItem
from steersman.learners.datasets import PromptRecord
from steersman.learners.features import conversation_text
from steersman.learners.tokens import TokenCounter

MOONCAKE_BLOCK = 512  # tokens a hash id names in the published trace


@dataclass(frozen=True)
class HashedRow:
    line: int
    arrival_s: float
    input_tokens: int
    output_tokens: int
    hash_ids: tuple[int, ...]


@dataclass
class HashedTrace:
    rows: list[HashedRow]
    skipped: list[tuple[int, str]] = field(default_factory=list)  # (line, why)


def load_hashed_trace(path: Path) -> HashedTrace:
    """Rows with non-negative numbers and integer hash ids; the rest are skipped and counted
    with their line numbers."""
    trace = HashedTrace([])
    opener = gzip.open if str(path).endswith(".gz") else open
    with opener(path, "rt", encoding="utf-8") as fh:
        for line, text in enumerate(fh, start=1):
            if not text.strip():
                continue
            try:
                trace.rows.append(_hashed_row(line, json.loads(text)))
            except (ValueError, TypeError) as exc:
                trace.skipped.append((line, str(exc)))
    return trace


def _hashed_row(line: int, obj: object) -> HashedRow:
    if not isinstance(obj, dict):
        raise ValueError("not a JSON object")
    values = []
    for name, kind in (("arrival_s", float), ("input_tokens", int), ("output_tokens", int)):
        value = obj.get(name)
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ValueError(f"field {name}: missing or not a number ({value!r})")
        if not math.isfinite(value) or value < 0:
            raise ValueError(f"field {name}: {value!r} is negative or not finite")
        values.append(kind(value))
    ids = obj.get("hash_ids")
    if not isinstance(ids, list) or not all(type(h) is int for h in ids):
        raise ValueError("field hash_ids: not a list of integers")
    return HashedRow(line, values[0], values[1], values[2], tuple(ids))


@dataclass(frozen=True)
class PrefixItem:
    arrival_s: float  # at the trace's own pace
    prompt_tokens: int
    output_tokens: int
    prefix: tuple[int, ...]  # segment hashes of the prompt (and, after it, of the response)
    segment_tokens: int
    messages: tuple[dict[str, str], ...] = ()  # multi-turn: the chat as sent
    token_ids: tuple[int, ...] = ()  # Mooncake: the prompt as sent


def mooncake_items(
    trace: HashedTrace, n: int, block_tokens: int, max_model_len: int, *, tokens: bool = False
) -> tuple[list[PrefixItem], list[int]]:
    """The first ``n`` requests, each hash id a segment of ``block_tokens`` tokens (the last one
    in proportion; outputs as published); (items, lines of the requests over the window: vLLM
    would refuse them, so they are left out and counted, not cut short)."""
    items, refused = [], []
    for row in trace.rows[:n]:
        if not row.hash_ids:
            continue
        last = row.input_tokens / MOONCAKE_BLOCK - (len(row.hash_ids) - 1)
        prompt = (len(row.hash_ids) - 1) * block_tokens + max(1, round(last * block_tokens))
        output = max(1, row.output_tokens)
        if prompt + output > max_model_len:
            refused.append(row.line)
            continue
        ids = _hash_tokens(row.hash_ids, block_tokens, prompt) if tokens else ()
        items.append(PrefixItem(row.arrival_s, prompt, output, row.hash_ids, block_tokens, (), ids))
    return items, refused


def _hash_tokens(hash_ids: Sequence[int], block_tokens: int, prompt: int) -> tuple[int, ...]:
    """One fixed block of random token ids per hash id: the same id, the same tokens."""
    out: list[int] = []
    for h in hash_ids:
        rng = random.Random(h)
        out.extend(rng.randrange(7, 2000) for _ in range(block_tokens))
    return tuple(out[:prompt])


def conversations(
    records: Sequence[PromptRecord],
    counter: TokenCounter,
    *,
    count: int,
    turns: int,
    think_s: float,
    max_model_len: int,
    seed: int,
) -> list[PrefixItem]:
    """``count`` chats of up to ``turns`` turns from real prompts and their real responses; each
    turn resends the history. Turns of a chat are ``think_s`` apart (after the answer, as a
    person reads and types); chats start one a second."""
    rng = random.Random(seed)
    pool = [r for r in records if len(r.response) < 2000]
    system = {"role": "system", "content": "You are a helpful assistant. Answer concisely."}
    items = []
    for c in range(count):
        history: list[dict[str, str]] = [system]
        for t in range(turns):
            record = rng.choice(pool)
            messages = (*history, {"role": "user", "content": record.prompt})
            text = conversation_text(messages=messages)
            prompt_ids = counter.tokenizer.encode(text, add_special_tokens=False).ids
            answer_ids = counter.tokenizer.encode(record.response, add_special_tokens=False).ids
            if len(prompt_ids) + len(answer_ids) + 1 > max_model_len:
                break
            segments = token_segments([*prompt_ids, *answer_ids], SEGMENT_TOKENS)
            items.append(
                PrefixItem(
                    c + t * think_s,
                    len(prompt_ids),
                    max(1, len(answer_ids)),
                    segments,
                    SEGMENT_TOKENS,
                    messages,
                )
            )
            history = [*messages, {"role": "assistant", "content": record.response}]
    items.sort(key=lambda i: i.arrival_s)
    return items


def work_items(
    items: Sequence[PrefixItem], source: str, rate: float | None = None
) -> list[WorkItem]:
    """The items as a replay sends them; with ``rate``, their arrivals rescaled to that mean
    rate (requests/s), keeping the trace's shape."""
    span = max((i.arrival_s for i in items), default=0.0) - min(
        (i.arrival_s for i in items), default=0.0
    )
    scale = 1.0 if rate is None or span <= 0 else len(items) / rate / span
    first = min((i.arrival_s for i in items), default=0.0)
    return [
        WorkItem(
            k,
            (i.arrival_s - first) * scale,
            f"{source}-{k}",
            source,
            "",
            i.prompt_tokens,
            i.output_tokens,
            i.messages,
            i.token_ids,
        )
        for k, i in enumerate(items)
    ]


def arrival_trace(trace: HashedTrace) -> Trace:
    """The hashed trace's arrivals as a plain trace. Its timestamps come in buckets of about
    3 s: the requests of a bucket are spread evenly across it."""
    rows = trace.rows
    times = sorted({r.arrival_s for r in rows})
    width = {t: (nxt - t) for t, nxt in itertools.pairwise(times)}
    counts: dict[float, int] = {}
    for r in rows:
        counts[r.arrival_s] = counts.get(r.arrival_s, 0) + 1
    seen: dict[float, int] = {}
    out = []
    for r in rows:
        k = seen[r.arrival_s] = seen.get(r.arrival_s, 0) + 1
        spread = width.get(r.arrival_s, 3.0) * (k - 1) / counts[r.arrival_s]
        out.append(TraceRow(r.arrival_s + spread, r.input_tokens, r.output_tokens))
    out.sort(key=lambda row: row.arrival_s)
    return Trace(out, len(trace.skipped))
