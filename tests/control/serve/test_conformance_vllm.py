"""The same requests, with the official openai client, straight to a vLLM CPU server and through
steersman: the answers must agree field by field (ids and creation times aside)."""

from __future__ import annotations

import uuid
from typing import Any

import openai
import pytest

from tests.control.serve.serving import running, settings_for

pytestmark = pytest.mark.vllm

TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
        },
    },
}
CHAT = [{"role": "user", "content": "What is the weather in Paris today?"}]
SEEDED = {"temperature": 0.8, "seed": 7}  # n > 1 samples; a seed makes it repeatable


@pytest.fixture(scope="module")
def clients(vllm_servers, tiny_model, tmp_path_factory):
    """A client straight to the first server, and one through steersman in front of it alone
    (the same server answers both: the comparison is of steersman, not of two servers)."""
    server = vllm_servers[0]
    instances = [{"name": "vllm-0", "url": server.url, "profile": "cpu-tiny"}]
    tmp = tmp_path_factory.mktemp("conformance")
    settings = settings_for(tmp, instances, predictor={"tokenizer_dir": str(tiny_model)})
    with running(settings) as (_, url):
        direct = openai.OpenAI(base_url=f"{server.url}/v1", api_key="none", max_retries=0)
        through = openai.OpenAI(base_url=f"{url}/v1", api_key="none", max_retries=0)
        yield direct, through
        direct.close()
        through.close()


def _plain(value: Any) -> Any:
    """A response as comparable data: ids and times dropped, floats rounded, nulls and empty
    lists treated as absent (a field that is null says nothing either way)."""
    if isinstance(value, dict):
        out = {}
        for key, item in value.items():
            if key in ("id", "created"):
                continue
            item = _plain(item)
            if item not in (None, [], {}):
                out[key] = item
        return out
    if isinstance(value, list):
        return [_plain(v) for v in value]
    if isinstance(value, float):
        return round(value, 3)
    return value


JOINED = {"text", "content", "reasoning_content", "refusal", "arguments"}


def _fold(into: dict[str, Any], part: dict[str, Any]) -> None:
    for key, value in part.items():
        if isinstance(value, str) and key in JOINED:
            into[key] = (into.get(key) or "") + value
        elif isinstance(value, dict):
            _fold(into.setdefault(key, {}), value)
        elif isinstance(value, list):
            kept = into.setdefault(key, [])
            for item in value:
                same = [k for k in kept if isinstance(item, dict) and "index" in item
                        and isinstance(k, dict) and k.get("index") == item["index"]]  # fmt: skip
                if same:
                    _fold(same[0], item)
                else:
                    kept.append({} if isinstance(item, dict) else item)
                    if isinstance(item, dict):
                        _fold(kept[-1], item)
        elif value is not None or key not in into:
            into[key] = value


def _said(chunks: list[dict[str, Any]]) -> dict[str, Any]:
    """What a stream says, whatever its chunking (a busy server sends several tokens in one
    chunk, and interleaves choices as it pleases): per choice, its text, tool calls and logprobs
    in order and the last of its other fields; the stream's own fields."""
    top: dict[str, Any] = {}
    choices: dict[int, dict[str, Any]] = {}
    for chunk in chunks:
        _fold(top, {k: v for k, v in chunk.items() if k != "choices"})
        for choice in chunk.get("choices") or ():
            _fold(choices.setdefault(choice.get("index", 0), {}), choice)
    return {**top, "choices": [choices[k] for k in sorted(choices)]}


def _both(clients, create, **kwargs: Any) -> tuple[Any, Any]:
    """The same request each way; a fresh cache salt for each keeps vLLM's prefix cache from
    answering one of them with a differently computed prefill."""
    answers = []
    for client in clients:
        extra = {**kwargs.pop("extra_body", {}), "cache_salt": uuid.uuid4().hex}
        kwargs["extra_body"] = extra
        answer = create(client)(**kwargs)
        if kwargs.get("stream"):
            answer = _said([_plain(chunk.model_dump()) for chunk in answer])
        else:
            answer = _plain(answer.model_dump())
        answers.append(answer)
    return answers[0], answers[1]


def completions(client):
    return client.completions.create


def chat(client):
    return client.chat.completions.create


CASES = {
    "completion": (completions, {"prompt": "Once upon a time", "max_tokens": 12, "logprobs": 3}),
    "completion n=2": (
        completions,
        {"prompt": "The sky is", "max_tokens": 6, "n": 2, "logprobs": 1, "stop": ["."], **SEEDED},
    ),
    "completion echo": (
        completions,
        {"prompt": "Roses are red", "max_tokens": 5, "echo": True, "logprobs": 2},
    ),
    "completion prompt_logprobs": (
        completions,
        {"prompt": "Hello there", "max_tokens": 4, "extra_body": {"prompt_logprobs": 2}},
    ),
    "chat logprobs n=2": (
        chat,
        {"messages": CHAT, "max_tokens": 10, "n": 2, "logprobs": True, "top_logprobs": 2, **SEEDED},
    ),
    "chat json": (
        chat,
        {"messages": CHAT, "max_tokens": 16, "response_format": {"type": "json_object"}},
    ),
    "chat forced tool": (
        chat,
        {
            "messages": CHAT,
            "max_tokens": 24,
            "tools": [TOOL],
            "tool_choice": {"type": "function", "function": {"name": "get_weather"}},
        },
    ),
}


# vLLM refuses prompt_logprobs with stream=true (tested below).
PAIRS = [(c, s) for c in CASES for s in (False, True) if not (s and "prompt_logprobs" in c)]


@pytest.mark.parametrize(("case", "stream"), PAIRS, ids=[f"{c}-{s}" for c, s in PAIRS])
def test_answers_agree_field_by_field(clients, case, stream):
    create, kwargs = CASES[case]
    kwargs = {"model": "tiny", "temperature": 0.0, **kwargs, "stream": stream}
    if stream:
        kwargs["stream_options"] = {"include_usage": True}
    direct, through = _both(clients, create, **kwargs)
    assert through == direct
    assert direct["choices"]  # something came back to compare


def test_stop_sequence_and_stop_reason_agree(clients):
    direct_client = clients[0]
    sample = direct_client.completions.create(
        model="tiny", prompt="One two three", max_tokens=16, temperature=0.0,
        extra_body={"ignore_eos": True},
    )  # fmt: skip
    text = sample.choices[0].text
    stop = text[4:8]
    assert stop.strip(), f"the sample answer {text!r} has no stop sequence to cut at"
    answers = []
    for stream in (False, True):
        kwargs = {"prompt": "One two three", "max_tokens": 16, "stop": [stop], "stream": stream}
        direct, through = _both(clients, completions, model="tiny", temperature=0.0, **kwargs)
        assert through == direct
        answers.append(through)
    assert answers[0]["choices"][0]["stop_reason"] == stop
    assert answers[0]["choices"][0]["finish_reason"] == "stop"


def test_an_answer_only_a_non_streamed_body_carries_passes_through(clients):
    direct, through = _both(
        clients, completions, model="tiny", prompt="Hello there", max_tokens=4,
        temperature=0.0, extra_body={"prompt_logprobs": 1},
    )  # fmt: skip
    logprobs = through["choices"][0]["prompt_logprobs"]
    assert logprobs == direct["choices"][0]["prompt_logprobs"]
    assert len(logprobs) >= 2  # one per prompt token (the first has none)
    with pytest.raises(openai.BadRequestError) as refused:
        clients[1].completions.create(
            model="tiny", prompt="Hello", max_tokens=4, stream=True,
            extra_body={"prompt_logprobs": 1},
        )  # fmt: skip
    assert "prompt_logprobs" in str(refused.value)
