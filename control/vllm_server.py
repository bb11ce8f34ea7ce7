"""Starts and stops local vLLM CPU servers (tests, the demo, calibration): separate processes,
possibly from their own virtual environment, always stopped."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path

import httpx


def free_port() -> int:
    """A TCP port free on loopback right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class ServerFailed(RuntimeError):
    """The server exited or did not answer /health in time; the message ends with its log."""


class VllmServer:
    """``with VllmServer(python, model_dir, port, core=0) as server: ... server.url``.

    One core per server (``VLLM_CPU_OMP_THREADS_BIND``), 1 GiB of KV cache, float32 (the bf16
    kernels vLLM picks on CPUs that advertise AMX die with SIGILL where AMX is not enabled),
    eager mode, priority scheduling, and a private RPC directory so stale sockets of an earlier
    run cannot interfere.
    """

    def __init__(
        self,
        python: str,
        model_dir: Path,
        port: int,
        *,
        core: int | None = 0,
        served_name: str = "tiny",
        max_model_len: int = 1024,
        kv_cache_gib: int = 1,
        log_dir: Path | None = None,
        extra_args: tuple[str, ...] = (),
    ) -> None:
        self.python = python
        self.model_dir = Path(model_dir).resolve()
        self.port = port
        self.core = core
        self.served_name = served_name
        self.max_model_len = max_model_len
        self.kv_cache_gib = kv_cache_gib
        self.extra_args = extra_args
        self.log_dir = Path(log_dir or tempfile.mkdtemp(prefix="steersman-vllm-"))
        self.log_path = self.log_dir / f"vllm-{port}.log"
        self.process: subprocess.Popen[bytes] | None = None
        self.started_in_s: float | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def command(self) -> list[str]:
        return [
            self.python,
            "-m",
            "vllm.entrypoints.openai.api_server",
            "--model",
            str(self.model_dir),
            "--served-model-name",
            self.served_name,
            "--dtype",
            "float32",
            "--enforce-eager",
            "--max-model-len",
            str(self.max_model_len),
            "--scheduling-policy",
            "priority",
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
            *self.extra_args,
        ]

    def environment(self) -> dict[str, str]:
        rpc = self.log_dir / f"rpc-{self.port}"
        rpc.mkdir(parents=True, exist_ok=True)
        env = dict(os.environ)
        env.update(
            {
                "VLLM_CPU_KVCACHE_SPACE": str(self.kv_cache_gib),
                "VLLM_RPC_BASE_PATH": str(rpc),
                "HF_HUB_OFFLINE": "1",
                "TRANSFORMERS_OFFLINE": "1",
                "VLLM_NO_USAGE_STATS": "1",
            }
        )
        if self.core is not None:
            env["VLLM_CPU_OMP_THREADS_BIND"] = str(self.core)
        return env

    def start(self) -> VllmServer:
        self.log_dir.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "wb") as log:
            self.process = subprocess.Popen(
                self.command(),
                stdout=log,
                stderr=subprocess.STDOUT,
                env=self.environment(),
                # `python -m` puts the working directory first on sys.path: run where no folder
                # can shadow one of vLLM's imports.
                cwd=self.log_dir,
                # Its own process group, so stop() takes the workers too; but not a session of
                # its own: with the kernel's autogroup scheduling a new session would get one
                # share of the CPU against the whole session that drives it.
                process_group=0,
            )
        return self

    def wait_healthy(self, timeout_s: float = 120.0) -> float:
        """Block until /health answers 200; return the seconds it took from start."""
        assert self.process is not None, "start() first"
        started = time.monotonic()
        with httpx.Client(timeout=1.0) as client:
            while True:
                if self.process.poll() is not None:
                    raise ServerFailed(
                        f"vLLM on port {self.port} exited with "
                        f"{self.process.returncode}{self._log_tail()}"
                    )
                try:
                    if client.get(f"{self.url}/health").status_code == 200:
                        self.started_in_s = time.monotonic() - started
                        return self.started_in_s
                except httpx.HTTPError:
                    pass
                if time.monotonic() - started > timeout_s:
                    raise ServerFailed(
                        f"vLLM on port {self.port} not healthy after "
                        f"{timeout_s:.0f}s{self._log_tail()}"
                    )
                time.sleep(0.25)  # polling a process we do not control; no event to wait on

    def stop(self, grace_s: float = 15.0) -> None:
        if self.process is None or self.process.poll() is not None:
            return
        pgid = os.getpgid(self.process.pid)
        os.killpg(pgid, signal.SIGTERM)
        try:
            self.process.wait(grace_s)
        except subprocess.TimeoutExpired:
            os.killpg(pgid, signal.SIGKILL)
            self.process.wait(5)
        with contextlib.suppress(ProcessLookupError):  # workers left behind in the group
            os.killpg(pgid, signal.SIGKILL)

    def kill(self) -> None:
        """SIGKILL the server and its workers at once (fault tests)."""
        if self.process is not None and self.process.poll() is None:
            os.killpg(os.getpgid(self.process.pid), signal.SIGKILL)
            self.process.wait(5)

    def _log_tail(self, lines: int = 30) -> str:
        try:
            tail = self.log_path.read_text(errors="replace").splitlines()[-lines:]
        except OSError:
            return ""
        return "\n--- server log ---\n" + "\n".join(tail)

    def __enter__(self) -> VllmServer:
        self.start()
        try:
            self.wait_healthy()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
