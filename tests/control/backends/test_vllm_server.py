"""Starting vLLM servers: paths made absolute and checked first, failures in one clear line."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from steersman.control.backends.vllm_server import (
    ServerFailed,
    SetupError,
    VllmServer,
    check_port,
    free_port,
    model_directory,
    vllm_python,
)
from tests.conftest import VLLM_PYTHON, wait_until


def test_a_relative_interpreter_is_made_absolute_without_leaving_its_environment(
    tmp_path, monkeypatch
):
    venv = tmp_path / "env" / "bin"
    venv.mkdir(parents=True)
    (venv / "python").symlink_to(sys.executable)  # what a virtual environment holds
    monkeypatch.chdir(tmp_path)
    found = vllm_python("env/bin/python", probe=False)
    assert found == tmp_path / "env" / "bin" / "python"  # the link itself, not its target
    server = VllmServer("env/bin/python", Path("model"), free_port(), log_dir=Path("logs"))
    assert server.command()[0] == str(found)
    assert server.model_dir == tmp_path / "model" and server.log_dir == tmp_path / "logs"


def test_nice_lowers_the_priority_of_the_server_and_what_it_starts():
    server = VllmServer(sys.executable, Path("model"), free_port(), nice=10)
    at = server.command().index(sys.executable)
    probe = [*server.command()[:at], sys.executable, "-c", "import os; print(os.nice(0))"]
    assert int(subprocess.run(probe, capture_output=True, text=True, check=True).stdout) == min(
        os.nice(0) + 10, 19
    )
    assert VllmServer(sys.executable, Path("model"), 1).command()[0] == sys.executable


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="prctl is Linux's")
def test_a_server_does_not_outlive_the_process_that_started_it():
    """What VllmServer starts goes when its parent dies, even by SIGKILL (a demo or a test
    killed on a timeout): no orphan keeps a core and a port."""
    parent = subprocess.Popen(
        [sys.executable, "-c", (
            "import subprocess, sys, time\n"
            "from steersman.control.backends.vllm_server import _die_with_parent\n"
            "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(300)'],"
            " preexec_fn=_die_with_parent)\n"
            "print(child.pid, flush=True)\n"
            "time.sleep(300)\n"
        )],
        stdout=subprocess.PIPE,
        text=True,
    )  # fmt: skip
    child = int(parent.stdout.readline())
    assert _alive(child)
    parent.kill()
    parent.wait()
    wait_until(lambda: not _alive(child), 30, "the child to go with its parent")


def _alive(pid: int) -> bool:
    """Running (not gone, not a zombie waiting to be reaped)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state != "Z"


def test_a_missing_interpreter_names_the_path_and_the_fix(tmp_path):
    with pytest.raises(SetupError, match=r"install_vllm_cpu\.sh") as caught:
        vllm_python(tmp_path / "nope" / "python")
    assert str(tmp_path / "nope" / "python") in str(caught.value)


def test_an_interpreter_without_vllm_is_a_broken_environment():
    with pytest.raises(SetupError, match=r"`import vllm` fails \(ModuleNotFoundError"):
        vllm_python(sys.executable)


@pytest.mark.parametrize(
    ("files", "reason"),
    [
        ({}, "no config.json"),
        ({"config.json": "{not json"}, "config.json unreadable"),
        ({"config.json": "{}"}, "names no model_type"),
        (
            {"config.json": json.dumps({"model_type": "llama"}), "model.safetensors": "junk"},
            "model.safetensors does not load",
        ),
    ],
)
def test_a_model_directory_that_does_not_load_is_refused(tmp_path, files, reason):
    for name, content in files.items():
        (tmp_path / name).write_text(content)
    with pytest.raises(SetupError, match=reason):
        model_directory(tmp_path)
    with pytest.raises(SetupError, match="not found"):
        model_directory(tmp_path / "missing")


def test_the_tiny_model_passes_the_check(tiny_model):
    assert model_directory(tiny_model) == tiny_model.absolute()


def test_a_port_in_use_is_refused_before_anything_starts(tmp_path, tiny_model):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        port = taken.getsockname()[1]
        with pytest.raises(SetupError, match=f"port {port} on 127.0.0.1 is in use"):
            check_port(port)
        server = VllmServer(sys.executable, tiny_model, port, log_dir=tmp_path)
        with pytest.raises(SetupError, match="in use"):
            server.check()
    assert server.process is None


@pytest.mark.vllm
def test_a_server_that_exits_during_start_up_names_the_cause_and_its_log(tmp_path, tiny_model):
    if not Path(VLLM_PYTHON).exists():
        pytest.fail(f"no vLLM at {VLLM_PYTHON}")
    # A window larger than the model's positions: vLLM refuses it while starting.
    server = VllmServer(VLLM_PYTHON, tiny_model, free_port(), log_dir=tmp_path, max_model_len=10**6)
    with pytest.raises(ServerFailed) as caught, server:
        pass
    message = str(caught.value)
    assert "\n" not in message
    assert "exited during start-up" in message and str(server.log_path) in message
    assert "Error" in message and "max_model_len" in message.lower().replace("-", "_")
    assert server.process is not None and server.process.poll() is not None
    with pytest.raises(ProcessLookupError):
        os.killpg(server.process.pid, 0)  # nothing of its process group is left
