"""steersman as the endpoint picker (EPP) of the Gateway API Inference Extension, behind Envoy.

Envoy's ext_proc filter sends each request's headers and body here (the body in
``FULL_DUPLEX_STREAMED`` mode, buffered here to its end; or ``BUFFERED``, the mode in which Envoy
can fail open). The request goes through the same intake,
queue, admission and dispatch as the HTTP gateway's; the instance picked goes back to Envoy as
the ``x-gateway-destination-endpoint`` header and in ``envoy.lb`` dynamic metadata (GIE's
Endpoint Picker Protocol), and Envoy carries the bytes. The response path (headers, then body
chunks, observed in ``STREAMED`` mode) feeds the same accounting: first token, tokens, usage,
the core's ``finish``, the learners and the history.

A request that cannot be served is answered by Envoy with steersman's error in OpenAI's shape,
as the gateway would answer it (``openai_api``).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import uuid
from collections.abc import AsyncIterator, Callable
from typing import Any

import grpc
from envoy.config.core.v3 import base_pb2
from envoy.extensions.filters.http.ext_proc.v3.processing_mode_pb2 import ProcessingMode as _Mode
from envoy.service.ext_proc.v3 import external_processor_pb2 as pb
from envoy.service.ext_proc.v3 import external_processor_pb2_grpc as pb_grpc
from envoy.type.v3 import http_status_pb2
from google.protobuf import json_format, struct_pb2
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_health.v1._async import HealthServicer
from pydantic import ValidationError

from steersman.control.backends.base import StreamBroken
from steersman.control.backends.routed import AnswerReader, Leg, Routed
from steersman.control.serve.intake import EXPECTATION_HEADERS, BadHeader, expectation_of
from steersman.control.serve.openai_api import (
    ApiError,
    api_error,
    check_content,
    check_window,
    error_body,
    model_card,
)
from steersman.control.serve.schemas import ChatBody, CompletionBody
from steersman.control.serve.sections import EppSettings
from steersman.control.serve.service import Steersman

log = logging.getLogger(__name__)

DESTINATION = "x-gateway-destination-endpoint"
_KINDS = {
    "/v1/completions": ("completion", CompletionBody),
    "/v1/chat/completions": ("chat", ChatBody),
}
SERVICE = "envoy.service.ext_proc.v3.ExternalProcessor"


SUBSET = "x-gateway-destination-endpoint-subset"


def _subset(message: pb.ProcessingRequest, headers: dict[str, str]) -> list[str] | None:
    """The endpoints the gateway allows for this request (GIE's subset hint, in the
    ``envoy.lb.subset_hint`` metadata or as a header of the same name); None: any."""
    hint = message.metadata_context.filter_metadata.get("envoy.lb.subset_hint")
    if hint is not None and SUBSET in hint.fields:
        listed = json_format.MessageToDict(hint).get(SUBSET)
        if isinstance(listed, list):
            return [str(e) for e in listed]
        if isinstance(listed, str):
            return [e.strip() for e in listed.split(",") if e.strip()]
    if SUBSET in headers:
        return [e.strip() for e in headers[SUBSET].split(",") if e.strip()]
    return None


def _request_id(kind: str, envoy_id: str) -> str:
    """steersman's id of a request, from the id Envoy gives it (both of Envoy's filters see it)."""
    return f"{'chatcmpl' if kind == 'chat' else 'cmpl'}-{envoy_id}"


def _headers(message: pb.HttpHeaders) -> dict[str, str]:
    return {
        h.key.lower(): h.raw_value.decode("utf-8", "replace") if h.raw_value else h.value
        for h in message.headers.headers
    }


def _refusal(exc: ApiError) -> pb.ProcessingResponse:
    """A request Envoy answers itself, with steersman's error."""
    body = error_body(exc.message, exc.kind, exc.extra.get("param"), exc.extra.get("code"))
    return pb.ProcessingResponse(
        immediate_response=pb.ImmediateResponse(
            status=http_status_pb2.HttpStatus(code=exc.status),
            headers=pb.HeaderMutation(set_headers=[_header("content-type", "application/json")]),
            body=json.dumps(body).encode(),
            details="steersman",
        )
    )


def _header(key: str, value: str) -> base_pb2.HeaderValueOption:
    return base_pb2.HeaderValueOption(
        header=base_pb2.HeaderValue(key=key, raw_value=value.encode()),
        append_action=base_pb2.HeaderValueOption.OVERWRITE_IF_EXISTS_OR_ADD,
    )


def _continue(phase: str) -> pb.ProcessingResponse:
    common = pb.CommonResponse()
    if phase in ("request_headers", "response_headers"):
        return pb.ProcessingResponse(**{phase: pb.HeadersResponse(response=common)})
    if phase in ("request_body", "response_body"):
        return pb.ProcessingResponse(**{phase: pb.BodyResponse(response=common)})
    return pb.ProcessingResponse(**{phase: pb.TrailersResponse()})


def _routed(endpoint: str, body: bytes | None, duplex: bool) -> list[pb.ProcessingResponse]:
    """The pick as GIE's protocol has it: the header (the route is chosen again on it), the
    same value in ``envoy.lb`` metadata, and the body (``None``: the request has none). In full
    duplex mode the headers' answer carries the pick and the picker sends the body on; in
    buffered mode (Envoy answered the headers already) the body's answer carries both."""
    metadata = struct_pb2.Struct()
    metadata.update({"envoy.lb": {DESTINATION: endpoint}})
    headers = [_header(DESTINATION, endpoint)]
    if body is not None:
        headers.append(_header("content-length", str(len(body))))
    pick = pb.CommonResponse(
        header_mutation=pb.HeaderMutation(set_headers=headers), clear_route_cache=True
    )
    on_headers = pb.ProcessingResponse(
        request_headers=pb.HeadersResponse(response=pick), dynamic_metadata=metadata
    )
    if body is None:
        return [on_headers]
    if not duplex:
        pick.body_mutation.body = body
        on_body = pb.ProcessingResponse(
            request_body=pb.BodyResponse(response=pick), dynamic_metadata=metadata
        )
        return [on_body]
    streamed = pb.StreamedBodyResponse(body=body, end_of_stream=True)
    mutation = pb.CommonResponse(body_mutation=pb.BodyMutation(streamed_response=streamed))
    return [on_headers, pb.ProcessingResponse(request_body=pb.BodyResponse(response=mutation))]


class EndpointPicker(pb_grpc.ExternalProcessorServicer):
    """Envoy's ext_proc service: one ``Process`` stream per HTTP request."""

    def __init__(
        self,
        service: Steersman,
        legs: dict[str, Leg],
        models: Callable[[], list[dict[str, Any]]],
        max_body_bytes: int,
    ) -> None:
        self.service = service
        self.legs = legs
        self.models = models  # the servers' model cards, as the gateway knows them
        self.max_body_bytes = max_body_bytes
        self._runs: set[asyncio.Task[None]] = set()

    async def Process(
        self, requests: AsyncIterator[pb.ProcessingRequest], context: Any
    ) -> AsyncIterator[pb.ProcessingResponse]:
        headers: dict[str, str] = {}
        subset: list[str] | None = None
        body = b""
        duplex = True
        observed = False  # the response is read by another stream (Envoy's observing filter)
        answer: AnswerReader | None = None
        run: asyncio.Task[None] | None = None
        try:
            async for message in requests:
                phase = message.WhichOneof("request")
                if message.observability_mode:  # Envoy neither waits for nor reads an answer
                    answer = self._watch(message, phase, headers, answer)
                    if phase == "request_headers":
                        headers = _headers(message.request_headers)
                    continue
                if phase == "request_headers":
                    headers = _headers(message.request_headers)
                    subset = _subset(message, headers)
                    if message.HasField("protocol_config"):
                        modes = message.protocol_config
                        duplex = modes.request_body_mode == _Mode.FULL_DUPLEX_STREAMED
                        observed = modes.response_body_mode == _Mode.NONE
                    if message.request_headers.end_of_stream:  # no body: any healthy server
                        for response in self._anywhere(None, duplex):
                            yield response
                    elif not duplex:  # buffered: Envoy waits for this answer before the body
                        yield _continue(phase)
                elif phase == "request_body":
                    body += message.request_body.body
                    if len(body) > self.max_body_bytes:
                        limit = f"request body is larger than {self.max_body_bytes} bytes"
                        yield _refusal(ApiError(413, limit))
                        return
                    if not message.request_body.end_of_stream:
                        continue
                    try:
                        leg, run = await self._pick(headers, body, subset)
                    except ApiError as exc:
                        yield _refusal(exc)
                        return
                    if leg is None:
                        for response in self._anywhere(body, duplex):
                            yield response
                        continue
                    answer = None if observed else AnswerReader(leg)
                    routed, request = leg.picked.result()
                    sent = json.dumps(routed.body(request)).encode()
                    for response in _routed(routed.address, sent, duplex):
                        yield response
                elif phase == "response_headers":
                    if answer is not None:
                        answer.headers(
                            _headers(message.response_headers),
                            message.response_headers.end_of_stream,
                        )
                    yield _continue(phase)
                elif phase == "response_body":
                    if answer is not None:
                        answer.body(message.response_body.body, message.response_body.end_of_stream)
                    yield _continue(phase)
                else:
                    yield _continue(phase)
        finally:
            if answer is not None:
                answer.end(StreamBroken("Envoy ended the exchange before the answer's end"))
            if run is not None and not observed:
                with contextlib.suppress(Exception, asyncio.CancelledError):
                    await run

    def _watch(
        self,
        message: pb.ProcessingRequest,
        phase: str | None,
        headers: dict[str, str],
        answer: AnswerReader | None,
    ) -> AnswerReader | None:
        """An observing filter's message: the answer's headers and chunks, read into the leg."""
        if phase == "response_headers":
            answer = self._observe(headers)
            if answer is not None:
                response = message.response_headers
                answer.headers(_headers(response), response.end_of_stream)
        elif phase == "response_body" and answer is not None:
            answer.body(message.response_body.body, message.response_body.end_of_stream)
        return answer

    def _observe(self, headers: dict[str, str]) -> AnswerReader | None:
        kind = _KINDS.get(headers.get(":path", "").split("?")[0])
        if kind is None or "x-request-id" not in headers:
            return None
        leg = self.legs.get(_request_id(kind[0], headers["x-request-id"]))
        return None if leg is None else AnswerReader(leg)

    def _anywhere(self, body: bytes | None, duplex: bool) -> list[pb.ProcessingResponse]:
        """A request steersman does not schedule (model list, health) goes to a healthy server."""
        up = [i for i in self.service.instances.values() if i.healthy] or list(
            self.service.instances.values()
        )
        backend = up[0].backend
        if not isinstance(backend, Routed):
            raise RuntimeError("the endpoint picker needs instances with a url")
        return _routed(backend.address, body, duplex)

    async def _pick(
        self, headers: dict[str, str], raw: bytes, subset: list[str] | None = None
    ) -> tuple[Leg | None, asyncio.Task[None] | None]:
        """The request through intake and the core, until an instance takes it (one of
        ``subset``'s, the endpoints the gateway allows, when it names some)."""
        path = headers.get(":path", "").split("?")[0]
        if path not in _KINDS or headers.get(":method", "POST") != "POST":
            return None, None
        kind, schema = _KINDS[path]
        service = self.service
        request_id = _request_id(kind, headers.get("x-request-id") or uuid.uuid4().hex)
        try:
            data = json.loads(raw)
            check_content(schema.model_validate(data))
        except json.JSONDecodeError:
            raise ApiError(400, "request body is not valid JSON") from None
        except ValidationError as exc:
            first = exc.errors()[0]
            param = str(first["loc"][0]) if first.get("loc") else None  # a field, not a member
            message = f"{param or 'body'}: {first.get('msg', 'invalid')}"
            raise ApiError(400, message, param=param) from None
        try:
            card = model_card(self.models(), data)  # before any prediction runs
        except ApiError as exc:
            service.refuse(request_id, kind, data, exc.message)
            raise
        expectation = None
        if any(name in headers for name in EXPECTATION_HEADERS):
            default = (service.qoe.expected_ttft_s, service.qoe.expected_pace_s)
            try:
                expectation = expectation_of(headers, default)
            except BadHeader as exc:
                service.refuse(request_id, kind, data, str(exc))
                raise ApiError(400, str(exc), param=exc.header) from None
        candidates = None
        if subset is not None:
            by_address = {i.backend.address: i.name for i in service.instances.values()
                          if isinstance(i.backend, Routed)}  # fmt: skip
            candidates = frozenset(by_address[a] for a in subset if a in by_address)
            if not candidates:
                why = f"none of the endpoints the gateway allows ({', '.join(subset)}) is known"
                service.refuse(request_id, kind, data, why)
                raise ApiError(503, f"no instance could serve the request: {why}", "server_error")
        job = await service.prepare(request_id, kind, data, expectation, candidates)
        try:
            check_window(card, job.arrival.prompt_tokens or job.prediction.prompt_tokens)
        except ApiError as exc:
            service.refuse(request_id, kind, data, exc.message, job)
            raise
        leg = self.legs[request_id] = Leg()

        async def serve() -> None:
            try:
                async for _ in service.run(job):
                    pass  # Envoy carries the chunks to the client; run() accounts for them
            finally:
                self.legs.pop(request_id, None)

        run = asyncio.create_task(serve())
        self._runs.add(run)  # the loop keeps only a weak reference to a task
        run.add_done_callback(self._runs.discard)
        await asyncio.wait({leg.picked, run}, return_when=asyncio.FIRST_COMPLETED)
        if leg.picked.done():
            return leg, run
        failure = run.exception()
        raise api_error(failure if failure is not None else RuntimeError("no pick"))


async def start(picker: EndpointPicker, settings: EppSettings) -> tuple[grpc.aio.Server, int]:
    """The ext_proc and gRPC health services on ``settings.host:port``, on the running loop;
    the server and the port it listens on."""
    server = grpc.aio.server()
    pb_grpc.add_ExternalProcessorServicer_to_server(picker, server)
    health = HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health, server)
    for name in ("", SERVICE, "liveness", "readiness"):
        await health.set(name, health_pb2.HealthCheckResponse.SERVING)
    bound = server.add_insecure_port(f"{settings.host}:{settings.port}")
    if bound == 0:
        raise OSError(f"epp.port: cannot listen on {settings.host}:{settings.port}")
    await server.start()
    log.info("endpoint picker listening on %s:%d", settings.host, bound)
    return server, bound
