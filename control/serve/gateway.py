"""The OpenAI-compatible HTTP gateway (FastAPI): /v1 completions and chat, models, health,
metrics and read-only admin state. Errors use OpenAI's error shape; client mistakes are 4xx."""

from __future__ import annotations

import hmac
import json
import uuid
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import AbstractAsyncContextManager
from typing import Any

from fastapi import Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from prometheus_client import CONTENT_TYPE_LATEST
from pydantic import SecretStr
from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from steersman.control.serve.admin import admin_state
from steersman.control.serve.intake import EXPECTATION_HEADERS, BadHeader, expectation_of
from steersman.control.serve.openai_api import (
    ApiError,
    Assembly,
    StreamShape,
    api_error,
    check_content,
    check_window,
    error_body,
    model_card,
)
from steersman.control.serve.schemas import (
    GENERATION,
    ChatBody,
    CompletionBody,
    Health,
    errors,
)
from steersman.control.serve.sections import GatewaySettings
from steersman.control.serve.service import COMPLETE, Steersman


def _error_response(exc: ApiError) -> JSONResponse:
    body = error_body(exc.message, exc.kind, exc.extra.get("param"), exc.extra.get("code"))
    return JSONResponse(body, status_code=exc.status)


class BodyLimit:
    """Buffers the request body up to ``max_bytes``; a larger one is answered 413 at once."""

    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = dict(scope.get("headers") or ())
        declared = headers.get(b"content-length", b"").decode("latin-1")
        if declared.isdigit() and int(declared) > self.max_bytes:
            await self._too_large(send)
            return
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] != "http.request":
                break
            chunks.append(message.get("body", b""))
            size += len(chunks[-1])
            if size > self.max_bytes:
                await self._too_large(send)
                return
            if not message.get("more_body"):
                break
        buffered: list[Message] = [{"type": "http.request", "body": b"".join(chunks)}]

        async def replay() -> Message:
            return buffered.pop() if buffered else await receive()

        await self.app(scope, replay, send)

    async def _too_large(self, send: Send) -> None:
        body = error_body(
            f"request body is larger than {self.max_bytes} bytes", "invalid_request_error"
        )
        await JSONResponse(body, status_code=413)({"type": "http"}, _no_receive, send)


async def _no_receive() -> Message:
    return {"type": "http.disconnect"}


def _keys_check(keys: list[SecretStr], admin: list[SecretStr] | None = None) -> Callable:
    """A dependency: 401 without a valid bearer key; 403 for an inference key on admin paths."""
    wanted = [k.get_secret_value().encode() for k in keys]
    known = wanted + [k.get_secret_value().encode() for k in admin or []]

    def check(request: Request) -> None:
        if not wanted:
            return
        header = request.headers.get("authorization", "")
        token = header[7:].strip().encode() if header.lower().startswith("bearer ") else b""
        # Compare against every key so the time taken does not say which one nearly matched.
        matches = [hmac.compare_digest(token, key) for key in known]
        if any(matches[: len(wanted)]):
            return
        if any(matches):
            raise ApiError(403, "this key may not use this endpoint", "permission_error")
        raise ApiError(
            401, "missing or invalid API key", "authentication_error", code="invalid_api_key"
        )

    return check


def create_app(
    service: Steersman,
    settings: GatewaySettings,
    lifespan: Callable[[FastAPI], AbstractAsyncContextManager[None]] | None = None,
) -> FastAPI:
    app = FastAPI(title="steersman", version="0.1.0", lifespan=lifespan)
    app.add_middleware(BodyLimit, max_bytes=settings.max_body_bytes)
    app.state.models = []  # OpenAI model cards, filled by discover_models
    inference = Depends(_keys_check(settings.api_keys))
    admin = Depends(_keys_check(settings.admin_api_keys, settings.api_keys))

    @app.exception_handler(ApiError)
    async def api_error(_: Request, exc: ApiError) -> JSONResponse:
        return _error_response(exc)

    @app.exception_handler(RequestValidationError)
    async def _invalid(_: Request, exc: RequestValidationError) -> JSONResponse:
        first = exc.errors()[0] if exc.errors() else {}
        loc = [str(p) for p in first.get("loc", ()) if p != "body"]
        param = ".".join(loc) or None
        if first.get("type") == "json_invalid":
            message = "request body is not valid JSON"
        else:
            message = f"{param or 'body'}: {first.get('msg', 'invalid')}"
        return JSONResponse(error_body(message, "invalid_request_error", param), status_code=400)

    @app.exception_handler(HTTPException)
    async def _http(_: Request, exc: HTTPException) -> JSONResponse:
        kind = "not_found_error" if exc.status_code == 404 else "invalid_request_error"
        body = error_body(str(exc.detail), kind)
        return JSONResponse(body, status_code=exc.status_code, headers=exc.headers)  # Allow

    @app.post("/v1/completions", dependencies=[inference], responses=GENERATION)
    async def completions(body: CompletionBody, request: Request) -> Response:
        check_content(body)
        data = body.model_dump(exclude_unset=True)
        return await _serve(app, service, "completion", data, body.stream, request.headers)

    @app.post("/v1/chat/completions", dependencies=[inference], responses=GENERATION)
    async def chat(body: ChatBody, request: Request) -> Response:
        check_content(body)
        data = body.model_dump(exclude_unset=True)
        return await _serve(app, service, "chat", data, body.stream, request.headers)

    @app.get("/v1/models", dependencies=[inference], responses=errors(401, 403))
    async def models() -> dict[str, Any]:
        return {"object": "list", "data": app.state.models}

    @app.get("/health", response_model=Health, responses={503: {"model": Health}})
    async def health() -> JSONResponse:
        up = sum(1 for i in service.instances.values() if i.healthy)
        status = 200 if up else 503
        body = {"status": "ok" if up else "no healthy instance", "instances_up": up}
        return JSONResponse(body, status_code=status)

    @app.get(
        "/metrics",
        response_class=Response,
        responses={200: {"description": "Prometheus text format", "content": {
            CONTENT_TYPE_LATEST.split(";")[0]: {"schema": {"type": "string"}}}}},
    )  # fmt: skip
    async def metrics() -> Response:
        return Response(service.metrics.render(), media_type=CONTENT_TYPE_LATEST)

    @app.get("/admin/state", dependencies=[admin], responses=errors(401, 403))
    async def state() -> dict[str, Any]:
        return admin_state(service)

    return app


async def discover_models(app: FastAPI, service: Steersman) -> None:
    """Ask the instances which models they serve (the union, first card of each id)."""
    cards: dict[str, dict[str, Any]] = {}
    for instance in service.instances.values():
        for card in await instance.backend.models():
            cards.setdefault(str(card["id"]), card)
    if cards:
        app.state.models = list(cards.values())


async def _serve(
    app: FastAPI,
    service: Steersman,
    kind: str,
    data: dict[str, Any],
    stream: bool,
    headers: Mapping[str, str],
) -> Response:
    prefix = "chatcmpl" if kind == "chat" else "cmpl"
    request_id = f"{prefix}-{uuid.uuid4().hex}"
    try:
        card = model_card(app.state.models, data)  # before any prediction runs
        expectation = _expectation(headers, service)
    except ApiError as exc:
        service.refuse(request_id, kind, data, exc.message)
        raise
    job = await service.prepare(request_id, kind, data, expectation)
    try:
        # the whole input (a chat's history too), as the server will see it
        check_window(card, job.arrival.prompt_tokens or job.prediction.prompt_tokens)
    except ApiError as exc:
        service.refuse(request_id, kind, data, exc.message, job)
        raise
    chunks = service.run(job, respond_first=True)
    try:
        first = await anext(chunks, None)
    except Exception as exc:
        raise api_error(exc) from None
    options = data.get("stream_options") or {}
    if stream:
        return StreamingResponse(
            _sse(service, request_id, first, chunks, options), media_type="text/event-stream"
        )
    return await _collect(service, request_id, kind, first, chunks)


def _expectation(headers: Mapping[str, str], service: Steersman) -> tuple[float, float] | None:
    """The client's own expectation for its reader, when it sends one (a 400 naming the header
    when it is not a number of seconds in range)."""
    if not any(name in headers for name in EXPECTATION_HEADERS):
        return None
    default = (service.qoe.expected_ttft_s, service.qoe.expected_pace_s)
    try:
        return expectation_of(headers, default)
    except BadHeader as exc:
        raise ApiError(400, str(exc), param=exc.header) from None


async def _sse(
    service: Steersman,
    request_id: str,
    first: Any,
    chunks: AsyncIterator[Any],
    options: dict[str, Any],
) -> AsyncIterator[bytes]:
    shape = StreamShape(request_id, options)
    complete = False
    try:
        pending = [first] if first is not None else []
        while True:
            chunk = pending.pop() if pending else await anext(chunks, None)
            if chunk is COMPLETE:
                complete = True
                service.close_later(chunks)
                break
            if chunk is None:
                break
            for shaped in shape.feed(chunk):
                yield f"data: {json.dumps(shaped)}\n\n".encode()
        for shaped in shape.end():
            yield f"data: {json.dumps(shaped)}\n\n".encode()
    except Exception as exc:
        error = api_error(exc)
        body = error_body(error.message, error.kind)
        yield f"data: {json.dumps(body)}\n\n".encode()
    finally:
        if not complete:
            await chunks.aclose()  # a client that left mid-stream cancels the upstream request
    yield b"data: [DONE]\n\n"


async def _collect(
    service: Steersman,
    request_id: str,
    kind: str,
    first: Any,
    chunks: AsyncIterator[Any],
) -> JSONResponse:
    answer = Assembly(kind)
    try:
        chunk = first
        while chunk is not None:
            if chunk is COMPLETE:
                service.close_later(chunks)
                break
            answer.add(chunk)
            chunk = await anext(chunks, None)
    except Exception as exc:
        return _error_response(api_error(exc))
    return JSONResponse(answer.body(request_id))
