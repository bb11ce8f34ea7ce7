"""An instance that a gateway in front (Envoy) carries the bytes to, steersman only picking it
(a request that came through steersman's own gateway is streamed direct, as always).

The loop is the same as for an instance steersman streams from itself: the core dispatches the
request to the instance, the service "streams" it, learns from its outcome and records it. Here
``stream`` hands the pick to whoever waits for it (the endpoint picker answers Envoy with it) and
then yields the answer's chunks as the picker reads them off Envoy's response path.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import json
import socket
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from steersman.control.backends.base import (
    BackendError,
    GenerationRequest,
    GenerationResult,
    StreamBroken,
    StreamEvent,
    UpstreamRejected,
)
from steersman.control.backends.vllm_http import VllmHttpBackend

END = None  # the answer ended as it should


@dataclass
class Leg:
    """One request's way through the gateway in front: the pick, then the answer's chunks."""

    picked: asyncio.Future[tuple[Routed, GenerationRequest]] = field(
        default_factory=lambda: asyncio.get_running_loop().create_future()
    )
    chunks: asyncio.Queue[dict[str, Any] | BackendError | None] = field(
        default_factory=asyncio.Queue
    )

    def feed(self, item: dict[str, Any] | BackendError | None) -> None:
        self.chunks.put_nowait(item)


def _ip_of(host: str) -> str:
    """``host``'s address (itself when it is one; itself too when it cannot be resolved yet)."""
    try:
        ipaddress.ip_address(host)
        return host
    except ValueError:
        pass
    try:
        return socket.getaddrinfo(host, None)[0][4][0]
    except OSError:
        return host


class Routed:
    """A server reached through the gateway in front; probes and model cards go to it direct."""

    def __init__(
        self,
        direct: VllmHttpBackend,
        legs: dict[str, Leg],
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.name = direct.name
        self.direct = direct
        self.vllm = direct.vllm
        parts = urlsplit(direct.base_url)
        self.host = parts.hostname or ""
        self.port = parts.port or (443 if parts.scheme == "https" else 80)
        self.ip = _ip_of(self.host)
        self.legs = legs
        self._clock = clock

    async def stream(
        self, request: GenerationRequest, result: GenerationResult
    ) -> AsyncIterator[StreamEvent]:
        leg = self.legs.get(request.request_id)
        if leg is None:  # it came through steersman's own gateway: steersman carries the bytes
            async for event in self.direct.stream(request, result):
                yield event
            return
        if not leg.picked.done():
            leg.picked.set_result((self, request))
        while (item := await self._next(leg)) is not END:
            now = self._clock()
            if isinstance(item, BackendError):
                result.error = str(item)
                result.finished_at = now
                raise item
            result.account(item, now)
            yield StreamEvent(now, item)
        result.finished_at = self._clock()

    async def _next(self, leg: Leg) -> dict[str, Any] | BackendError | None:
        """The next word of the answer; a silence as long as an upstream read's deadline breaks
        it (nothing reported the answer's end)."""
        try:
            return await asyncio.wait_for(leg.chunks.get(), self.direct.read_timeout_s)
        except TimeoutError:
            silence = f"{self.name}: no word of the answer in {self.direct.read_timeout_s:g} s"
            return StreamBroken(silence)

    def body(self, request: GenerationRequest) -> dict[str, Any]:
        """What the server gets: the client's body with steersman's priority and hints."""
        body = dict(request.body)
        if self.vllm:
            if request.priority is not None:
                body["priority"] = request.priority
            if request.xargs:
                body["vllm_xargs"] = request.xargs
        return body

    @property
    def address(self) -> str:
        """Where Envoy sends the request: an IP address, as its ORIGINAL_DST cluster needs."""
        return f"{self.ip}:{self.port}"

    async def health(self) -> bool:
        ok = await self.direct.health()
        if ok and self.ip != self.host:  # a name (a pod's): its address may have moved
            with contextlib.suppress(OSError):
                found = await asyncio.get_running_loop().getaddrinfo(self.host, self.port)
                self.ip = found[0][4][0]
        return ok

    async def models(self) -> list[dict[str, Any]]:
        return await self.direct.models()

    async def aclose(self) -> None:
        await self.direct.aclose()


class AnswerReader:
    """An answer's response path as the gateway in front passes it on (its headers, then its
    body in pieces), read into the request's leg: server-sent events chunk by chunk, or a JSON
    body at its end."""

    def __init__(self, leg: Leg) -> None:
        self.leg = leg
        self.sse = False
        self.pending = b""
        self.ended = False

    def headers(self, headers: dict[str, str], end: bool) -> None:
        status = int(headers.get(":status", "200") or 200)
        self.sse = headers.get("content-type", "").startswith("text/event-stream")
        if 400 <= status < 500:
            self.end(UpstreamRejected(f"HTTP {status}", status))
        elif status >= 500:
            self.end(StreamBroken(f"HTTP {status}"))
        elif end:
            self.end(StreamBroken("the answer had no body"))

    def body(self, chunk: bytes, end: bool) -> None:
        if self.ended:
            return
        self.pending += chunk
        if self.sse:
            *lines, self.pending = self.pending.split(b"\n")
            for line in lines:
                self._line(line.removesuffix(b"\r").decode("utf-8", "replace"))
        if end:
            if self.sse:
                self._line(self.pending.decode("utf-8", "replace"))
                if not self.ended:
                    self.end(StreamBroken("stream ended without [DONE]"))
            else:
                self._whole(self.pending)

    def _line(self, line: str) -> None:
        if self.ended or not line.startswith("data:"):
            return
        payload = line[5:].strip()
        if payload == "[DONE]":
            self.end(END)
            return
        try:
            data = json.loads(payload)
        except json.JSONDecodeError:
            self.end(StreamBroken(f"unreadable chunk {payload[:80]!r}"))
            return
        if not isinstance(data, dict) or "error" in data:
            self.end(StreamBroken(f"server error mid-stream: {str(data)[:200]}"))
            return
        self.leg.feed(data)

    def _whole(self, raw: bytes) -> None:
        try:
            data = json.loads(raw)
        except json.JSONDecodeError:
            self.end(StreamBroken(f"unreadable body {raw[:80]!r}"))
            return
        if not isinstance(data, dict):
            self.end(StreamBroken("body is not an object"))
            return
        self.leg.feed(data)
        self.end(END)

    def end(self, item: BackendError | None) -> None:
        if not self.ended:
            self.ended = True
            self.leg.feed(item)
