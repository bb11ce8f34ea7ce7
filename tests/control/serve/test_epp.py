"""The endpoint picker over real gRPC, as Envoy would speak to it (no Envoy, no model server: a
pick only names a server; nothing is sent to it)."""

from __future__ import annotations

import json

import grpc
import pytest
from envoy.config.core.v3 import base_pb2
from envoy.extensions.filters.http.ext_proc.v3.processing_mode_pb2 import ProcessingMode
from envoy.service.ext_proc.v3 import external_processor_pb2 as pb
from envoy.service.ext_proc.v3 import external_processor_pb2_grpc as pb_grpc
from google.protobuf import struct_pb2
from grpc_health.v1 import health_pb2, health_pb2_grpc

from steersman.control.backends.vllm_server import free_port
from tests.control.serve.serving import running, settings_for

SERVERS = [f"127.0.0.1:{free_port()}", f"127.0.0.1:{free_port()}"]


@pytest.fixture(scope="module")
def channel(tmp_path_factory):
    instances = [{"name": f"s{k}", "url": f"http://{a}"} for k, a in enumerate(SERVERS)]
    settings = settings_for(
        tmp_path_factory.mktemp("epp"), instances, epp={"enabled": True, "port": 0}
    )
    with running(settings) as (daemon, _), _picker(daemon) as chan:
        yield chan


def _picker(daemon) -> grpc.Channel:
    return grpc.insecure_channel(f"127.0.0.1:{daemon.epp_port}")


def _headers(path: str, **extra: str) -> pb.ProcessingRequest:
    pairs = {":method": "POST", ":path": path, "content-type": "application/json", **extra}
    values = [base_pb2.HeaderValue(key=k, raw_value=v.encode()) for k, v in pairs.items()]
    config = pb.ProtocolConfiguration(
        request_body_mode=ProcessingMode.FULL_DUPLEX_STREAMED,
        response_body_mode=ProcessingMode.STREAMED,
    )
    return pb.ProcessingRequest(
        request_headers=pb.HttpHeaders(headers=base_pb2.HeaderMap(headers=values)),
        protocol_config=config,
    )


def _body(raw: bytes) -> pb.ProcessingRequest:
    return pb.ProcessingRequest(request_body=pb.HttpBody(body=raw, end_of_stream=True))


def _exchange(channel, messages: list[pb.ProcessingRequest]) -> list[pb.ProcessingResponse]:
    stub = pb_grpc.ExternalProcessorStub(channel)
    return list(stub.Process(iter(messages), timeout=30))


def test_a_pick_names_a_server_in_the_header_and_in_metadata(channel):
    body = json.dumps({"model": "m", "prompt": "Hello there", "max_tokens": 4}).encode()
    asked = [_headers("/v1/completions", **{"x-request-id": "r1"}), _body(body)]
    responses = _exchange(channel, asked)
    first, second = responses
    assert first.WhichOneof("response") == "request_headers"
    mutation = first.request_headers.response.header_mutation
    set_headers = {h.header.key: h.header.raw_value.decode() for h in mutation.set_headers}
    endpoint = set_headers["x-gateway-destination-endpoint"]
    assert endpoint in SERVERS
    assert first.dynamic_metadata["envoy.lb"]["x-gateway-destination-endpoint"] == endpoint
    assert first.request_headers.response.clear_route_cache
    sent = second.request_body.response.body_mutation.streamed_response
    assert sent.end_of_stream and json.loads(sent.body)["prompt"] == "Hello there"
    assert int(set_headers["content-length"]) == len(sent.body)


def test_out_of_order_messages_get_answers_not_a_crash(channel):
    stray = [
        pb.ProcessingRequest(response_body=pb.HttpBody(body=b"data: {}\n\n", end_of_stream=True)),
        pb.ProcessingRequest(request_trailers=pb.HttpTrailers()),
    ]
    responses = _exchange(channel, stray)
    assert [r.WhichOneof("response") for r in responses] == ["response_body", "request_trailers"]


def test_garbage_on_the_wire_fails_that_call_only(channel):
    raw = channel.stream_stream(
        "/envoy.service.ext_proc.v3.ExternalProcessor/Process",
        request_serializer=lambda b: b,
        response_deserializer=lambda b: b,
    )
    with pytest.raises(grpc.RpcError) as failed:
        list(raw(iter([b"\xff\x00garbage"]), timeout=30))
    assert failed.value.code() in (grpc.StatusCode.INTERNAL, grpc.StatusCode.UNKNOWN)
    health = health_pb2_grpc.HealthStub(channel)
    for service in ("", "envoy.service.ext_proc.v3.ExternalProcessor", "readiness"):
        answer = health.Check(health_pb2.HealthCheckRequest(service=service), timeout=10)
        assert answer.status == health_pb2.HealthCheckResponse.SERVING


def test_a_body_that_is_not_json_is_refused_in_openai_shape(channel):
    responses = _exchange(channel, [_headers("/v1/chat/completions"), _body(b"{oops")])
    (refusal,) = responses
    immediate = refusal.immediate_response
    assert immediate.status.code == 400
    assert json.loads(immediate.body)["error"]["type"] == "invalid_request_error"


def test_a_request_steersman_sheds_is_a_429_in_openai_shape(tmp_path):
    settings = settings_for(
        tmp_path,
        [{"name": "s0", "url": f"http://{SERVERS[0]}"}],
        epp={"enabled": True, "port": 0},
        dispatch={"max_queue": 0},  # no room to wait: every request is shed
    )
    body = json.dumps({"model": "m", "prompt": "Hi", "max_tokens": 4}).encode()
    with running(settings) as (daemon, _), _picker(daemon) as chan:
        (shed,) = _exchange(chan, [_headers("/v1/completions"), _body(body)])
    assert shed.immediate_response.status.code == 429
    error = json.loads(shed.immediate_response.body)["error"]
    assert error["type"] == "rate_limit_error" and "capacity" in error["message"]


def _pick(channel, headers: pb.ProcessingRequest) -> pb.ProcessingResponse:
    body = json.dumps({"model": "m", "prompt": "Hello", "max_tokens": 2}).encode()
    return _exchange(channel, [headers, _body(body)])[0]


def _endpoint(response: pb.ProcessingResponse) -> str:
    return response.dynamic_metadata["envoy.lb"]["x-gateway-destination-endpoint"]


def test_the_gateways_subset_hint_bounds_the_pick(channel):
    only = SERVERS[1]
    for k in range(4):  # in metadata, as GIE's protocol has it
        asked = _headers("/v1/completions", **{"x-request-id": f"m{k}"})
        hint = struct_pb2.Struct()
        hint.update({"x-gateway-destination-endpoint-subset": [only]})
        asked.metadata_context.filter_metadata["envoy.lb.subset_hint"].CopyFrom(hint)
        assert _endpoint(_pick(channel, asked)) == only
    header = {"x-request-id": "h1", "x-gateway-destination-endpoint-subset": SERVERS[0]}
    assert _endpoint(_pick(channel, _headers("/v1/completions", **header))) == SERVERS[0]
    unknown = {"x-request-id": "u1", "x-gateway-destination-endpoint-subset": "10.9.9.9:1"}
    refused = _pick(channel, _headers("/v1/completions", **unknown)).immediate_response
    assert refused.status.code == 503 and b"10.9.9.9:1" in refused.body
