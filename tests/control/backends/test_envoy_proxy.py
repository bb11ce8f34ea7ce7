"""The Envoy configuration the picker's tests and demo run: accepted by the real binary."""

from __future__ import annotations

import json
import subprocess

import pytest

from steersman.control.backends.envoy_proxy import envoy_binary, envoy_config


def _validate(path) -> subprocess.CompletedProcess:
    """The real Envoy's own check of a configuration file."""
    return subprocess.run(
        [str(envoy_binary()), "--mode", "validate", "-c", str(path), "--use-dynamic-base-id"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip


@pytest.mark.parametrize(
    ("fail_open", "observe"), [(False, False), (True, False), (False, True), (True, True)]
)
def test_the_real_envoy_accepts_the_configuration(tmp_path, fail_open, observe):
    config = envoy_config(
        10000, 10001, "127.0.0.1:9002", ["127.0.0.1:8001", "127.0.0.1:8002"],
        fail_open=fail_open, observe=observe,
    )  # fmt: skip
    path = tmp_path / "envoy.json"
    path.write_text(json.dumps(config))
    checked = _validate(path)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert "configuration" in (checked.stdout + checked.stderr).lower()
    ext_proc = config["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]
    filters = ext_proc["typed_config"]["http_filters"]
    mode = filters[0]["typed_config"]["processing_mode"]
    assert mode["request_body_mode"] == ("BUFFERED" if fail_open else "FULL_DUPLEX_STREAMED")
    assert mode["response_body_mode"] == ("NONE" if observe else "STREAMED")
    assert len(filters) == (3 if observe else 2)  # the observing filter, the router


def test_envoy_alone_is_a_round_robin_without_filters(tmp_path):
    config = envoy_config(10000, 10001, None, ["127.0.0.1:8001"])
    manager = config["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]
    assert [f["name"] for f in manager["typed_config"]["http_filters"]] == [
        "envoy.filters.http.router"
    ]
    path = tmp_path / "envoy.json"
    path.write_text(json.dumps(config))
    checked = _validate(path)
    assert checked.returncode == 0, checked.stdout + checked.stderr


def test_a_broken_configuration_is_refused_by_envoy(tmp_path):
    path = tmp_path / "envoy.json"
    path.write_text(json.dumps({"static_resources": {"clusters": [{"name": "x", "type": "NOPE"}]}}))
    checked = _validate(path)
    assert checked.returncode != 0
