"""The backend interface: a request goes in as plain data, events and a result come out."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol


@dataclass(frozen=True)
class GenerationRequest:
    """One OpenAI-style request as a backend receives it.

    ``body`` is the OpenAI request body (``prompt`` or ``messages``, ``max_tokens``, ...);
    ``priority`` and ``xargs`` become vLLM's ``priority`` and ``vllm_xargs``. ``stream``:
    asked for as a stream (only an answer that a stream cannot carry is not).
    """

    request_id: str
    kind: Literal["completion", "chat"]
    body: dict[str, Any]
    priority: int | None = None
    xargs: dict[str, Any] | None = None
    stream: bool = True


@dataclass
class GenerationResult:
    """What happened to one request, including partial timing when it failed mid-stream.

    Times are monotonic seconds; ``token_times`` holds (time, completion tokens so far) per
    streamed chunk that carried tokens.
    """

    request_id: str
    instance: str
    started_at: float
    first_token_at: float | None = None
    finished_at: float | None = None
    token_times: list[tuple[float, int]] = field(default_factory=list)
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    cached_tokens: int | None = None  # prompt tokens served from the prefix cache, if reported
    finish_reason: str | None = None
    texts: dict[int, str] = field(default_factory=dict)
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None and self.finished_at is not None

    @property
    def ttft(self) -> float | None:
        return None if self.first_token_at is None else self.first_token_at - self.started_at

    @property
    def e2e(self) -> float | None:
        return None if self.finished_at is None else self.finished_at - self.started_at

    def account(self, data: dict[str, Any], now: float) -> None:
        """Fold one streamed OpenAI chunk in: text per choice, token arrival times, usage."""
        produced = False
        for choice in data.get("choices") or ():
            index = choice.get("index", 0)
            delta = choice.get("text")
            if delta is None:
                delta = (choice.get("delta") or choice.get("message") or {}).get("content")
            if delta:
                self.texts[index] = self.texts.get(index, "") + delta
                produced = True
            if choice.get("finish_reason"):
                self.finish_reason = choice["finish_reason"]
        usage = data.get("usage") or {}
        if usage:
            self.prompt_tokens = usage.get("prompt_tokens", self.prompt_tokens)
            self.completion_tokens = usage.get("completion_tokens", self.completion_tokens)
            details = usage.get("prompt_tokens_details") or {}
            if isinstance(details, dict) and isinstance(details.get("cached_tokens"), int):
                self.cached_tokens = details["cached_tokens"]
        tokens = self.completion_tokens
        last = self.token_times[-1][1] if self.token_times else 0
        if tokens is not None and tokens > last:
            self.token_times.append((now, tokens))
        elif produced and not usage:
            self.token_times.append((now, last + 1))  # no per-chunk usage: a token per chunk
        if self.first_token_at is None and self.token_times:
            self.first_token_at = self.token_times[0][0]

    @property
    def tpot(self) -> float | None:
        """Mean time per output token after the first."""
        n = self.completion_tokens
        if n is None or n < 2 or self.first_token_at is None or self.finished_at is None:
            return None
        return (self.finished_at - self.first_token_at) / (n - 1)


class BackendError(Exception):
    """A request failed at the backend. ``retryable``: nothing reached the client yet and
    another instance may serve it."""

    retryable = False

    def __init__(self, message: str, result: GenerationResult | None = None) -> None:
        super().__init__(message)
        self.result = result


class InstanceUnavailable(BackendError):
    """Could not connect, timed out before the first byte, or a 5xx before streaming."""

    retryable = True


class UpstreamRejected(BackendError):
    """The instance refused the request itself (4xx): the client's mistake, not the instance's."""

    def __init__(self, message: str, status: int, body: Any = None) -> None:
        super().__init__(message)
        self.status = status
        self.body = body


class StreamBroken(BackendError):
    """The stream ended early or carried something unreadable; partial timing is kept."""


@dataclass(frozen=True)
class StreamEvent:
    t: float
    data: dict[str, Any]


class Backend(Protocol):
    name: str

    def stream(
        self, request: GenerationRequest, result: GenerationResult
    ) -> AsyncIterator[StreamEvent]:
        """OpenAI-shaped streaming chunks; fills ``result`` as they arrive."""
        ...

    async def health(self) -> bool: ...

    async def models(self) -> list[dict[str, Any]]:
        """OpenAI model cards (``id``, and ``max_model_len`` where known); [] when unreachable."""
        ...

    async def aclose(self) -> None: ...
