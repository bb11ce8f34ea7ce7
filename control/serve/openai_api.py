"""OpenAI's API as steersman speaks it, whichever front door a request came through: what a
request must carry (``check_content``, ``model_card``, ``check_window``: an ``ApiError`` in
OpenAI's error shape otherwise), what a failure becomes (``api_error``), and an engine's answer
as the client asked for it.

steersman reads every answer as a stream (its first token and each token's time drive the core),
so a client that did not ask for a stream gets the chunks assembled into the body the engine
would have sent: every field the engine streamed is kept (text, tool calls, logprobs, stop
reasons, usage, fields an engine adds of its own). An answer that a stream does not carry
(vLLM's ``prompt_logprobs`` and ``kv_transfer_params``, an echoed prompt with its logprobs) is
asked for unstreamed (``streamable``), and that body passes through as it is.
"""

from __future__ import annotations

import time
from typing import Any

from steersman.control.backends.base import BackendError, UpstreamRejected
from steersman.control.core.scheduler import QueueFull
from steersman.control.serve.schemas import ChatBody, CompletionBody


class ApiError(Exception):
    def __init__(
        self, status: int, message: str, kind: str = "invalid_request_error", **extra: Any
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.kind = kind
        self.extra = extra


def error_body(message: str, kind: str, param: str | None = None, code: Any = None) -> dict:
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


def check_content(body: CompletionBody | ChatBody) -> None:
    """A 400 for a request with nothing to answer."""
    if isinstance(body, CompletionBody):
        prompt = body.prompt
        if prompt in ("", []) or (isinstance(prompt, list) and "" in prompt):
            raise ApiError(400, "prompt must not be empty", param="prompt")
    elif not any(m.content for m in body.messages):
        raise ApiError(400, "messages must carry some content", param="messages")


def model_card(models: list[dict[str, Any]], data: dict[str, Any]) -> dict[str, Any] | None:
    """The card of the requested model; 404 for one no instance serves. None when no instance
    has answered yet (the instance then judges)."""
    cards = {c["id"]: c for c in models}
    if not cards:
        return None
    card = cards.get(data["model"])
    if card is None:
        raise ApiError(
            404,
            f"The model `{data['model']}` does not exist. Available: {', '.join(cards)}",
            "not_found_error",
            param="model",
            code="model_not_found",
        )
    return card


def check_window(card: dict[str, Any] | None, prompt_tokens: int | None) -> None:
    window = card.get("max_model_len") if card else None
    if isinstance(window, int) and prompt_tokens is not None and prompt_tokens >= window:
        raise ApiError(
            400,
            f"This model's maximum context length is {window} tokens; the prompt has "
            f"{prompt_tokens} tokens. Shorten the prompt.",
            param="prompt",
            code="context_length_exceeded",
        )


def api_error(exc: Exception) -> ApiError:
    """A failure as the client hears of it: the engine's own 4xx, 429 when steersman sheds,
    503 when no instance served it, 500 otherwise."""
    if isinstance(exc, UpstreamRejected):
        body = exc.body if isinstance(exc.body, dict) else {}
        inner = body.get("error") if isinstance(body.get("error"), dict) else body
        message = inner.get("message") if isinstance(inner.get("message"), str) else str(exc)
        status = exc.status if 400 <= exc.status < 500 else 400
        return ApiError(status, message)
    if isinstance(exc, QueueFull):
        return ApiError(429, f"steersman is at capacity: {exc}", "rate_limit_error")
    if isinstance(exc, BackendError):
        return ApiError(503, f"no instance could serve the request: {exc}", "server_error")
    return ApiError(500, f"internal error: {type(exc).__name__}", "server_error")


# Strings that arrive in pieces and are joined; any other scalar is the last one sent.
_JOINED = frozenset({"text", "content", "reasoning", "reasoning_content", "refusal", "arguments"})
# Request fields whose answer only a non-streamed response carries.
_UNSTREAMABLE = ("prompt_logprobs", "kv_transfer_params")


def streamable(body: dict[str, Any]) -> bool:
    """Whether the engine can be asked for this answer as a stream without losing a field.

    >>> streamable({"prompt": "hi"}), streamable({"prompt": "hi", "prompt_logprobs": 1})
    (True, False)
    >>> streamable({"prompt": "hi", "prompt_logprobs": None}), streamable({"echo": True})
    (True, True)
    >>> streamable({"prompt": "hi", "echo": True, "logprobs": 1})
    False
    """
    # An echo with logprobs needs the prompt's logprobs: vLLM fails such streams mid-way.
    echo = bool(body.get("echo")) and bool(body.get("logprobs") or body.get("top_logprobs"))
    return not echo and all(body.get(key) is None for key in _UNSTREAMABLE)


def merge(into: dict[str, Any], part: dict[str, Any]) -> None:
    """Fold one chunk's piece into what came before: pieces of text are joined, lists are
    extended (items that carry an ``index``, like tool calls, are merged by it), objects are
    merged key by key, other values replaced; a null never overwrites a value.

    >>> a = {}
    >>> merge(a, {"content": "Hel", "tool_calls": [{"index": 0, "function": {"arguments": "{"}}]})
    >>> merge(a, {"content": "lo", "tool_calls": [{"index": 0, "function": {"arguments": "}"}}]})
    >>> a
    {'content': 'Hello', 'tool_calls': [{'index': 0, 'function': {'arguments': '{}'}}]}
    """
    for key, value in part.items():
        old = into.get(key)
        if value is None:
            into.setdefault(key, None)
        elif key in _JOINED and isinstance(value, str):
            into[key] = (old if isinstance(old, str) else "") + value
        elif isinstance(value, dict):
            if not isinstance(old, dict):
                old = into[key] = {}
            merge(old, value)
        elif isinstance(value, list):
            if not isinstance(old, list):
                old = into[key] = []
            _extend(old, value)
        else:
            into[key] = value


def _extend(into: list[Any], items: list[Any]) -> None:
    for item in items:
        if isinstance(item, dict) and "index" in item:
            key = item["index"]
            same = next((o for o in into if isinstance(o, dict) and o.get("index") == key), None)
            if same is not None:
                merge(same, item)
                continue
            into.append({})
            merge(into[-1], item)
        else:
            into.append(item)


class Assembly:
    """The non-streamed body of a streamed answer, built chunk by chunk (a non-streamed body
    added whole comes out as it went in).

    >>> a = Assembly("chat")
    >>> a.add({"model": "m", "choices": [{"delta": {"role": "assistant", "content": "Hi"}}]})
    >>> a.add({"choices": [{"delta": {"content": "!"}, "finish_reason": "stop"}]})
    >>> a.add({"choices": [], "usage": {"completion_tokens": 2}})
    >>> a.body("chatcmpl-1")["choices"][0]
    {'message': {'role': 'assistant', 'content': 'Hi!'}, 'finish_reason': 'stop', 'logprobs': None}
    """

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self.top: dict[str, Any] = {}
        self.choices: dict[int, dict[str, Any]] = {}

    def add(self, chunk: dict[str, Any]) -> None:
        for key, value in chunk.items():
            if key == "choices":
                for choice in value or ():
                    self._add_choice(choice)
            elif key == "usage":
                if value:  # the last usage is the whole answer's
                    self.top["usage"] = value
            elif key not in ("id", "object"):
                merge(self.top, {key: value})

    def _add_choice(self, choice: Any) -> None:
        if not isinstance(choice, dict):
            return
        piece = dict(choice)
        if "delta" in piece:
            piece["message"] = piece.pop("delta")
        index = piece.get("index", 0)
        merge(self.choices.setdefault(index if isinstance(index, int) else 0, {}), piece)

    def body(self, request_id: str) -> dict[str, Any]:
        chat = self.kind == "chat"
        choices = []
        for index in sorted(self.choices):
            choice = self.choices[index]
            if chat:
                message = choice.setdefault("message", {})
                message.setdefault("role", "assistant")
                message.setdefault("content", None)
                for call in message.get("tool_calls") or ():
                    if isinstance(call, dict):
                        call.pop("index", None)  # a stream's merge key; a body has none
            else:
                choice.setdefault("text", "")
            choice.setdefault("logprobs", None)
            choice.setdefault("finish_reason", None)
            choices.append(choice)
        obj = "chat.completion" if chat else "text_completion"
        return {"id": request_id, "object": obj, **self.top, "choices": choices}


class StreamShape:
    """An engine's chunks as the client asked for its stream: steersman's id; usage only when
    asked for (steersman asks every engine for it, per chunk).

    An engine that was asked for usage stamps its ``system_fingerprint`` on the usage chunk
    instead of each choice's last chunk; for a client that did not ask for usage, a last chunk
    waits for the next one and takes the fingerprint from it (in an ``n`` > 1 stream, only the
    choice that ends last can).

    >>> s = StreamShape("c1", {})
    >>> s.feed({"id": "x", "choices": [{"text": "a"}], "usage": {"total_tokens": 3}})
    [{'id': 'c1', 'choices': [{'text': 'a'}]}]
    >>> s.feed({"choices": [{"text": "b", "finish_reason": "stop"}]})
    []
    >>> s.feed({"choices": [], "usage": {"total_tokens": 4}, "system_fingerprint": "fp"})
    [{'choices': [{'text': 'b', 'finish_reason': 'stop'}], 'id': 'c1', 'system_fingerprint': 'fp'}]
    """

    def __init__(self, request_id: str, options: dict[str, Any]) -> None:
        self.request_id = request_id
        self.usage_asked = bool(options.get("include_usage"))
        self.every_usage = bool(options.get("continuous_usage_stats"))
        self.held: dict[str, Any] | None = None
        self.last_usage: dict[str, Any] | None = None
        self.last_object = "text_completion"
        self.usage_sent = False

    def feed(self, chunk: dict[str, Any]) -> list[dict[str, Any]]:
        self.last_usage = chunk.get("usage") or self.last_usage
        self.last_object = chunk.get("object", self.last_object)
        chunk = {**chunk, "id": self.request_id}
        if not chunk.get("choices"):  # the engine's usage chunk
            if self.usage_asked:
                self.usage_sent = True
                return [*self._release(), chunk]
            return self._release(chunk.get("system_fingerprint"))
        if not self.every_usage:
            chunk.pop("usage", None)
        out = self._release()
        last = any(isinstance(c, dict) and c.get("finish_reason") for c in chunk["choices"])
        if last and not self.usage_asked and not chunk.get("system_fingerprint"):
            self.held = chunk
        else:
            out.append(chunk)
        return out

    def end(self) -> list[dict[str, Any]]:
        """What is still owed at the end: a held chunk, the usage the client asked for when
        the engine sent none of its own."""
        out = self._release()
        if self.usage_asked and not self.usage_sent and self.last_usage:
            tail = {"id": self.request_id, "object": self.last_object, "created": int(time.time())}
            out.append({**tail, "choices": [], "usage": self.last_usage})
        return out

    def _release(self, fingerprint: Any = None) -> list[dict[str, Any]]:
        held, self.held = self.held, None
        if held is None:
            return []
        if fingerprint is not None:
            held["system_fingerprint"] = fingerprint
        return [held]
