"""The HTTP backend against a misbehaving OpenAI-compatible server on loopback."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import ClassVar

import pytest

from steersman.control.backends.base import (
    GenerationRequest,
    GenerationResult,
    InstanceUnavailable,
    StreamBroken,
    UpstreamRejected,
)
from steersman.control.backends.vllm_http import VllmHttpBackend


def _chunk(n: int) -> bytes:
    data = {
        "choices": [{"index": 0, "text": f" w{n}", "finish_reason": None}],
        "usage": {"prompt_tokens": 3, "completion_tokens": n, "total_tokens": 3 + n},
    }
    return f"data: {json.dumps(data)}\n\n".encode()


class _Misbehaving(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    release: ClassVar[threading.Event] = threading.Event()
    seen: ClassVar[list[dict]] = []

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        self.seen.append(body)
        mode = body.get("prompt")
        if mode == "overloaded":
            self._plain(503, b'{"error": {"message": "overloaded"}}')
            return
        if mode == "bad-request":
            self._plain(400, b'{"error": {"message": "max_tokens must be positive"}}')
            return
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Connection", "close")
        self.end_headers()
        for n in (1, 2, 3):
            self.wfile.write(_chunk(n))
            self.wfile.flush()
        if mode == "garbage":
            self.wfile.write(b"data: {not json\n\n")
        elif mode == "error-chunk":
            self.wfile.write(b'data: {"error": {"message": "engine died"}}\n\n')
        elif mode == "stall":
            self.release.wait(10)
        elif mode == "odd-text":  # what a model may generate, unescaped in JSON
            text = {"choices": [{"index": 0, "text": "a\u2028b\x85c\x1cd"}]}
            self.wfile.write(f"data: {json.dumps(text, ensure_ascii=False)}\r\n\r\n".encode())
            self.wfile.write(b"data: [DONE]\n\n")
        elif mode == "ok":
            self.wfile.write(b"data: [DONE]\n\n")
        # "truncated": just close the connection without [DONE]
        self.wfile.flush()
        self.close_connection = True

    def _plain(self, status: int, body: bytes) -> None:
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def server() -> Iterator[str]:
    _Misbehaving.release = threading.Event()
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _Misbehaving)
    httpd.daemon_threads = True
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    _Misbehaving.release.set()
    httpd.shutdown()
    httpd.server_close()


def _run(url: str, prompt: str, **kw):
    async def go():
        backend = VllmHttpBackend("x", url, **kw)
        result = GenerationResult("r", "x", time.monotonic())
        try:
            async for _ in backend.stream(
                GenerationRequest(
                    "r",
                    "completion",
                    {"prompt": prompt, "max_tokens": 9},
                    priority=4,
                    xargs={"predicted": 9},
                ),
                result,
            ):
                pass
            return result, None
        except Exception as exc:
            return result, exc
        finally:
            await backend.aclose()

    return asyncio.run(go())


def test_a_clean_stream_and_what_is_sent_upstream(server):
    result, error = _run(server, "ok")
    assert error is None and result.ok and result.completion_tokens == 3
    sent = _Misbehaving.seen[-1]
    assert sent["stream"] is True and sent["priority"] == 4
    assert sent["vllm_xargs"] == {"predicted": 9}
    assert sent["stream_options"] == {"include_usage": True, "continuous_usage_stats": True}


def test_line_separators_inside_generated_text_do_not_break_the_stream(server):
    result, error = _run(server, "odd-text")
    assert error is None and result.ok and result.completion_tokens == 3


@pytest.mark.parametrize(
    ("mode", "reason"),
    [
        ("garbage", "unreadable chunk"),
        ("error-chunk", "server error mid-stream"),
        ("truncated", "without [DONE]"),
    ],
)
def test_a_broken_stream_fails_with_its_reason_and_keeps_partial_timing(server, mode, reason):
    result, error = _run(server, mode)
    assert isinstance(error, StreamBroken) and not error.retryable
    assert reason in str(error) and reason in result.error
    assert [n for _, n in result.token_times] == [1, 2, 3]
    assert result.ttft is not None and result.finished_at is not None


def test_a_stalled_stream_hits_its_read_deadline(server):
    started = time.monotonic()
    result, error = _run(server, "stall", read_timeout_s=0.5)
    assert isinstance(error, StreamBroken) and "ReadTimeout after 3 chunks" in str(error)
    assert time.monotonic() - started < 5 and len(result.token_times) == 3


def test_status_codes_map_to_typed_errors(server):
    _, overloaded = _run(server, "overloaded")
    assert isinstance(overloaded, InstanceUnavailable) and overloaded.retryable
    _, rejected = _run(server, "bad-request")
    assert isinstance(rejected, UpstreamRejected) and rejected.status == 400
    assert "max_tokens must be positive" in str(rejected)
