"""A real vLLM instance (or any OpenAI-compatible server) over HTTP, with one pooled client."""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import httpx

from steersman.control.backends.base import (
    GenerationRequest,
    GenerationResult,
    InstanceUnavailable,
    StreamBroken,
    StreamEvent,
    UpstreamRejected,
)

_PATHS = {"completion": "/v1/completions", "chat": "/v1/chat/completions"}


class VllmHttpBackend:
    """Streams every request upstream, so TTFT, TPOT and QoE are measured for all of them.

    With ``vllm=True`` (a vLLM server) each chunk carries cumulative usage
    (``continuous_usage_stats``), so every token's arrival time is known exactly; ``priority``
    and ``vllm_xargs`` are passed through. Every network call has a deadline.
    """

    def __init__(
        self,
        name: str,
        base_url: str,
        *,
        connect_timeout_s: float = 2.0,
        read_timeout_s: float = 60.0,
        max_connections: int = 256,
        vllm: bool = True,
        api_key: str | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.name = name
        self.base_url = base_url.rstrip("/")
        self.vllm = vllm
        self.read_timeout_s = read_timeout_s
        self._clock = clock
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.client = httpx.AsyncClient(
            base_url=self.base_url,
            headers=headers,
            timeout=httpx.Timeout(read_timeout_s, connect=connect_timeout_s),
            limits=httpx.Limits(
                max_connections=max_connections, max_keepalive_connections=max_connections
            ),
        )

    def _body(self, request: GenerationRequest) -> dict[str, Any]:
        body = dict(request.body)
        body["stream"] = request.stream
        if self.vllm:
            if request.priority is not None:
                body["priority"] = request.priority
            if request.xargs:
                body["vllm_xargs"] = request.xargs
        if request.stream:
            options = dict(body.get("stream_options") or {})
            options["include_usage"] = True
            if self.vllm:
                options["continuous_usage_stats"] = True
            body["stream_options"] = options
        else:
            body.pop("stream_options", None)
        return body

    async def stream(
        self, request: GenerationRequest, result: GenerationResult
    ) -> AsyncIterator[StreamEvent]:
        url = _PATHS[request.kind]
        done = False
        try:
            async with self.client.stream("POST", url, json=self._body(request)) as response:
                if response.status_code >= 400:
                    raw = await response.aread()
                    _raise_for_status(self.name, response.status_code, raw, result)
                if not request.stream:
                    data = await self._whole(response, result)
                    done = True
                    yield StreamEvent(result.finished_at or self._clock(), data)
                    return
                async for line in _sse_lines(response):
                    # Read to the end after [DONE] (vLLM ends the body there): a response read
                    # to its end leaves its connection in the pool for the next request.
                    if done or not line.startswith("data:"):
                        continue
                    payload = line[5:].strip()
                    if payload == "[DONE]":
                        done = True
                        result.finished_at = self._clock()
                        continue
                    now = self._clock()
                    try:
                        data = json.loads(payload)
                    except json.JSONDecodeError:
                        raise self._broken(
                            result, now, f"unreadable chunk {payload[:80]!r}"
                        ) from None
                    if not isinstance(data, dict):
                        raise self._broken(result, now, "chunk is not an object")
                    if "error" in data:
                        raise self._broken(result, now, f"server error mid-stream: {data['error']}")
                    result.account(data, now)
                    yield StreamEvent(now, data)
        except (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout) as exc:
            result.error = f"{self.name}: cannot connect: {type(exc).__name__}"
            raise InstanceUnavailable(result.error, result) from None
        except (httpx.ReadTimeout, httpx.RemoteProtocolError, httpx.ReadError) as exc:
            if done:
                return  # the answer was complete; only the connection's end was not
            message = f"{self.name}: {type(exc).__name__} after {len(result.token_times)} chunks"
            if not result.token_times:
                result.error = message
                raise InstanceUnavailable(message, result) from None
            raise self._broken(result, self._clock(), message) from None
        if not done:
            raise self._broken(result, self._clock(), "stream ended without [DONE]")

    async def _whole(self, response: httpx.Response, result: GenerationResult) -> dict[str, Any]:
        """A non-streamed answer: its first token reaches the client with the whole body."""
        raw = await response.aread()
        now = self._clock()
        try:
            data = json.loads(raw)
        except json.JSONDecodeError:
            raise self._broken(result, now, f"unreadable body {raw[:80]!r}") from None
        if not isinstance(data, dict):
            raise self._broken(result, now, "body is not an object")
        result.account(data, now)
        result.finished_at = now
        return data

    def _broken(self, result: GenerationResult, now: float, why: str) -> StreamBroken:
        result.error = f"{self.name}: {why}"
        result.finished_at = now
        return StreamBroken(result.error, result)

    async def health(self, timeout_s: float = 1.0) -> bool:
        try:
            response = await self.client.get("/health", timeout=timeout_s)
        except httpx.HTTPError:
            return False
        return response.status_code == 200

    async def models(self, timeout_s: float = 2.0) -> list[dict[str, Any]]:
        try:
            response = await self.client.get("/v1/models", timeout=timeout_s)
            data = response.json().get("data") if response.status_code == 200 else None
        except (httpx.HTTPError, ValueError, AttributeError):
            return []
        return (
            [m for m in data if isinstance(m, dict) and "id" in m] if isinstance(data, list) else []
        )

    async def aclose(self) -> None:
        await self.client.aclose()


def _raise_for_status(name: str, status: int, raw: bytes, result: GenerationResult) -> None:
    text = raw.decode("utf-8", errors="replace")
    try:
        body: Any = json.loads(text)
    except json.JSONDecodeError:
        body = text
    message = body.get("error", {}).get("message", text) if isinstance(body, dict) else text
    if isinstance(body, dict) and isinstance(body.get("message"), str):
        message = body["message"]
    result.error = f"{name}: HTTP {status}: {str(message)[:300]}"
    if status >= 500 or status == 429:
        raise InstanceUnavailable(result.error, result)
    raise UpstreamRejected(result.error, status, body)


async def _sse_lines(response: httpx.Response) -> AsyncIterator[str]:
    r"""The stream's lines as server-sent events end them (LF, CRLF), unlike ``aiter_lines``,
    which also splits on U+2028, U+0085 and other characters a model may generate and a JSON
    chunk carries unescaped.

    >>> import asyncio
    >>> body = 'data: {"text": "a\u2028b"}\r\n\ndata: [DONE]\n'.encode()
    >>> async def lines():
    ...     return [x async for x in _sse_lines(httpx.Response(200, content=body))]
    >>> asyncio.run(lines())
    ['data: {"text": "a\u2028b"}', '', 'data: [DONE]']
    """
    pending = b""
    async for chunk in response.aiter_bytes():
        pending += chunk
        *lines, pending = pending.split(b"\n")
        for line in lines:
            yield line.removesuffix(b"\r").decode("utf-8", errors="replace")
    if pending:
        yield pending.removesuffix(b"\r").decode("utf-8", errors="replace")
