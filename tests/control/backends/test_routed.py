"""A server that Envoy carries the bytes to: its address for Envoy, its answer read from a leg."""

from __future__ import annotations

import asyncio

import pytest

from steersman.control.backends.base import GenerationRequest, GenerationResult, StreamBroken
from steersman.control.backends.routed import END, AnswerReader, Leg, Routed
from steersman.control.backends.vllm_http import VllmHttpBackend


@pytest.mark.parametrize(
    ("url", "address"),
    [
        ("http://10.1.2.3:8000", "10.1.2.3:8000"),
        ("http://localhost:8001", "127.0.0.1:8001"),  # Envoy's ORIGINAL_DST takes addresses
        ("http://no-such-host.invalid", "no-such-host.invalid:80"),  # kept until it resolves
    ],
)
def test_the_address_envoy_gets(url, address):
    assert Routed(VllmHttpBackend("s", url), {}).address == address


def _stream(routed: Routed, legs: dict[str, Leg], items: list) -> tuple[list, GenerationResult]:
    async def go():
        legs["r1"] = leg = Leg()
        result = GenerationResult("r1", "s", 0.0)
        request = GenerationRequest("r1", "completion", {"prompt": "hi"}, priority=3)
        got = []

        async def read():
            async for event in routed.stream(request, result):
                got.append(event.data)

        reader = asyncio.create_task(read())
        picked_backend, picked_request = await leg.picked
        assert picked_backend is routed and routed.body(picked_request)["priority"] == 3
        for item in items:
            leg.feed(item)
        try:
            await reader
        except StreamBroken as exc:
            got.append(exc)
        return got, result

    return asyncio.run(go())


def test_the_answer_is_read_from_the_leg_into_the_result():
    legs: dict[str, Leg] = {}
    routed = Routed(VllmHttpBackend("s", "http://127.0.0.1:9"), legs)
    chunk = {"choices": [{"text": "a"}], "usage": {"completion_tokens": 1, "prompt_tokens": 2}}
    got, result = _stream(routed, legs, [chunk, END])
    assert got == [chunk] and result.completion_tokens == 1 and result.finished_at is not None


def test_a_silent_answer_is_broken_after_the_read_deadline():
    legs: dict[str, Leg] = {}
    routed = Routed(VllmHttpBackend("s", "http://127.0.0.1:9", read_timeout_s=0.05), legs)
    got, result = _stream(routed, legs, [])
    assert isinstance(got[-1], StreamBroken) and "no word" in str(got[-1])
    assert result.error is not None


def _read(feed) -> list:
    async def go():
        leg = Leg()
        reader = AnswerReader(leg)
        feed(reader)
        got = []
        while not leg.chunks.empty():
            got.append(leg.chunks.get_nowait())
        return got

    return asyncio.run(go())


def test_server_sent_events_split_anywhere_are_read_whole():
    def feed(reader: AnswerReader) -> None:
        reader.headers({":status": "200", "content-type": "text/event-stream"}, False)
        reader.body(b'data: {"choices": [{"te', False)
        reader.body(b'xt": "a"}]}\r\n\ndata: {"choices": [{"text": "b"}]}\n\ndata: [DO', False)
        reader.body(b"NE]\n\n", True)

    got = _read(feed)
    assert got == [{"choices": [{"text": "a"}]}, {"choices": [{"text": "b"}]}, END]


@pytest.mark.parametrize(
    ("status", "body", "kind"),
    [
        ("400", b'{"error": {"message": "bad"}}', "UpstreamRejected"),
        ("503", b"", "StreamBroken"),
        ("200", b"{not json", "StreamBroken"),
    ],
)
def test_a_failed_or_unreadable_answer_ends_the_leg_with_an_error(status, body, kind):
    def feed(reader: AnswerReader) -> None:
        reader.headers({":status": status, "content-type": "application/json"}, False)
        reader.body(body, True)

    got = _read(feed)
    assert type(got[-1]).__name__ == kind and len(got) == 1


def test_a_json_answer_is_read_at_its_end():
    def feed(reader: AnswerReader) -> None:
        reader.headers({":status": "200", "content-type": "application/json"}, False)
        reader.body(b'{"choices": [{"text": "hi"}], ', False)
        reader.body(b'"usage": {"completion_tokens": 1}}', True)

    got = _read(feed)
    assert got[0]["usage"]["completion_tokens"] == 1 and got[1] is END
