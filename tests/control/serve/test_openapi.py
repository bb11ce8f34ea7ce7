"""The gateway against its own OpenAPI document, with schemathesis: every response's status,
content type and body are declared there, and nothing it generates gets a server error."""

from __future__ import annotations

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings

from tests.control.serve.serving import running, settings_for

SIMS = [{"name": "sim-a", "sim": "cpu-tiny"}, {"name": "sim-b", "sim": "cpu-tiny"}]


@pytest.fixture(scope="module")
def gateway_url(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("openapi")
    with running(settings_for(tmp, SIMS)) as (_, url):
        yield url


def test_every_response_is_declared_and_none_is_a_server_error(gateway_url):
    schema = schemathesis.openapi.from_url(f"{gateway_url}/openapi.json")
    operations = [result.ok() for result in schema.get_all_operations()]
    assert len(operations) >= 6
    for operation in operations:

        @given(case=operation.as_strategy())
        @settings(
            max_examples=40,
            derandomize=True,  # the same cases every run
            deadline=None,
            suppress_health_check=list(HealthCheck),
        )
        def check(case):
            case.call_and_validate(timeout=60)  # its conformance checks, no server error

        check()


def test_the_document_declares_errors_streams_and_metrics(gateway_url):
    doc = httpx.get(f"{gateway_url}/openapi.json").json()
    chat = doc["paths"]["/v1/chat/completions"]["post"]["responses"]
    assert {"400", "401", "403", "404", "413", "429", "503"} <= set(chat)
    assert chat["404"]["content"]["application/json"]["schema"]["$ref"].endswith("ErrorResponse")
    assert "text/event-stream" in chat["200"]["content"]
    assert "text/plain" in doc["paths"]["/metrics"]["get"]["responses"]["200"]["content"]


def test_a_wrong_method_is_answered_405_with_allow(gateway_url):
    r = httpx.get(f"{gateway_url}/v1/completions")
    assert r.status_code == 405 and r.headers["allow"] == "POST"
    assert r.json()["error"]["type"] == "invalid_request_error"
