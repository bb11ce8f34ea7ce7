"""Intake: a request's body made into the loop's ``Job`` (the core's arrival, the history row)."""

from __future__ import annotations

import hashlib
import logging
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from steersman.control.core.prefix import SEGMENT_TOKENS, token_segments
from steersman.control.core.records import RequestRecord
from steersman.control.core.scheduler import Arrival, Assignment
from steersman.control.serve.predictor import Prediction
from steersman.learners.features import conversation_text, prompt_text

log = logging.getLogger(__name__)

Tokenize = Callable[[str], Sequence[int]]


@dataclass
class Job:
    """One request on its way through the loop."""

    request_id: str
    kind: str  # "completion" or "chat"
    body: dict[str, Any]
    prediction: Prediction
    arrival: Arrival
    record: RequestRecord
    assignment: Assignment | None = None
    retries: int = 0
    prefill_mark: int | None = None  # its instance's ``prefilled`` when its first token came


def text_of(kind: str, body: dict[str, Any]) -> tuple[str, int]:
    """The text the length model reads, and the number of turns."""
    if kind == "chat":
        return prompt_text(messages=body.get("messages"))
    return prompt_text(prompt=body.get("prompt"))


def streamed(body: dict[str, Any]) -> bool:
    """Whether the client reads the answer as it streams (the QoE rule serves only those; a
    non-streamed answer keeps latency as its objective).

    >>> streamed({"stream": True}), streamed({}), streamed({"stream": "yes"})
    (True, False, False)
    """
    return body.get("stream") is True


def max_tokens_of(body: dict[str, Any]) -> int | None:
    """The client's ``max_tokens`` (or ``max_completion_tokens``) when it is a positive int.

    >>> max_tokens_of({"max_tokens": 16}), max_tokens_of({"max_tokens": -1}), max_tokens_of({})
    (16, None, None)
    """
    raw = body.get("max_tokens") or body.get("max_completion_tokens")
    return raw if isinstance(raw, int) and raw > 0 else None


def token_ids(kind: str, body: dict[str, Any], tokenize: Tokenize | None) -> Sequence[int]:
    """The whole input's tokens (every turn of a chat), or none without a tokenizer."""
    prompt = body.get("prompt")
    if kind != "chat" and isinstance(prompt, list) and all(type(t) is int for t in prompt):
        return prompt  # token ids already
    if tokenize is None:
        return ()
    if kind == "chat":
        text = conversation_text(messages=body.get("messages"))
    else:
        text = conversation_text(prompt=prompt)
    try:
        return tokenize(text)
    except Exception:  # a tokenizer hiccup costs the prefix, not the request
        log.debug("tokenizing the prompt failed", exc_info=True)
        return ()


class BadHeader(ValueError):
    def __init__(self, header: str, message: str) -> None:
        super().__init__(message)
        self.header = header


EXPECTATION_HEADERS = {
    "x-steersman-expected-ttft": 600.0,  # seconds to the first token, at most this
    "x-steersman-expected-pace": 60.0,  # seconds between tokens, at most this
}


def expectation_of(headers: Mapping[str, str], default: tuple[float, float]) -> tuple[float, float]:
    """What the client says its reader expects (``x-steersman-expected-ttft`` and
    ``x-steersman-expected-pace``, in seconds), over the settings' ``default``; raises
    BadHeader naming the header and the value when one is not a number in its range.

    >>> expectation_of({"x-steersman-expected-pace": "0.05"}, (1.0, 0.2))
    (1.0, 0.05)
    >>> try:
    ...     expectation_of({"x-steersman-expected-ttft": "nan"}, (1.0, 0.2))
    ... except BadHeader as e:
    ...     print(e)
    header x-steersman-expected-ttft: 'nan' is not a number of seconds in (0, 600]
    """
    out = list(default)
    for k, (name, top) in enumerate(EXPECTATION_HEADERS.items()):
        raw = headers.get(name)
        if raw is None:
            continue
        try:
            value = float(raw)
        except ValueError:
            value = math.nan
        if not 0 < value <= top:  # NaN fails too
            message = f"header {name}: {raw!r} is not a number of seconds in (0, {top:g}]"
            raise BadHeader(name, message)
        out[k] = value
    return out[0], out[1]


def make_job(
    request_id: str,
    kind: str,
    body: dict[str, Any],
    text: str,
    p: Prediction,
    received: float,
    *,
    ids: Sequence[int],
    store_prompts: bool,
    max_tokens_is_length: bool,
    model_version: str | None,
    expectation: tuple[float, float] = (1.0, 0.2),
    queue_by_ttft: bool = False,
    candidates: frozenset[str] | None = None,
) -> Job:
    """The request as the core sees it (``Arrival``) and as the history will (``RequestRecord``).

    ``text`` is what the length model read (``text_of``); ``ids`` the whole input's tokens
    (``token_ids``; none without a tokenizer). With ``max_tokens_is_length``
    (replays), ``max_tokens`` is the true length, not a cap. ``expectation``: its reader's
    (TTFT, pace); with ``queue_by_ttft`` (streamed QoE on) it waits in the queue by when its
    first token is due. ``candidates``: the instances it may go to (a gateway's subset).
    """
    max_tokens = max_tokens_of(body)
    arrival = Arrival(
        request_id,
        len(ids) if ids else p.prompt_tokens or 0,
        p.x,
        request_class=p.request_class,
        max_tokens=None if max_tokens_is_length else max_tokens,
        true_tokens=max_tokens if max_tokens_is_length else None,
        prefix=token_segments(ids, SEGMENT_TOKENS),
        segment_tokens=SEGMENT_TOKENS,
        expected_ttft_s=expectation[0] if queue_by_ttft else None,
        candidates=candidates,
    )
    record = RequestRecord(
        request_id,
        received,
        request_class=p.request_class,
        prompt_tokens=p.prompt_tokens,
        prompt_sha256=sha256(text),
        prompt_text=text if store_prompts else None,
        features=p.x,
        max_tokens=max_tokens,
        predictor_path=p.path,
        base_prediction=p.base,
        model_version=model_version,
        expected_ttft_s=expectation[0],
        expected_pace_s=expectation[1],
    )
    return Job(request_id, kind, body, p, arrival, record)


def sha256(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8", "replace")).hexdigest()
