"""`steersman telemetry` with simulated GPUs at the pynvml boundary, and with none."""

from __future__ import annotations

import json
import time

import pynvml
from typer.testing import CliRunner

from steersman.control.cli.main import app
from tests.telemetry.fake_nvml import FakeGpu, FakeNvml

runner = CliRunner()


def test_once_as_json_reads_every_gpu(monkeypatch):
    FakeNvml([FakeGpu(0), FakeGpu(1, gpm=False, temperature=83)], time.monotonic).install(
        monkeypatch
    )
    result = runner.invoke(app, ["telemetry", "--once", "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["available"] is True
    gpus = {g["gpu_index"]: g for g in data["gpus"]}
    assert gpus[0]["method"] == "gpm" and gpus[1]["method"] == "samples"
    assert gpus[1]["temperature_c"] == 83.0
    assert 0.0 <= gpus[0]["sm_activity"] <= 1.0
    assert gpus[0]["features"]["samples"] >= 3


def test_once_as_a_table(monkeypatch):
    FakeNvml([FakeGpu(0, reasons=0x4)], time.monotonic).install(monkeypatch)
    result = runner.invoke(app, ["telemetry", "--once"])
    assert result.exit_code == 0
    assert "sm%" in result.stdout and "0x4" in result.stdout and "gpm" in result.stdout


def test_no_gpu_says_so_and_exits_0(monkeypatch):
    FakeNvml([], time.monotonic, init_error=pynvml.NVML_ERROR_DRIVER_NOT_LOADED).install(
        monkeypatch
    )
    as_json = runner.invoke(app, ["telemetry", "--json"])
    assert as_json.exit_code == 0
    assert json.loads(as_json.stdout) == {
        "available": False,
        "reason": "NVML unavailable: Driver Not Loaded",
    }
    plain = runner.invoke(app, ["telemetry"])
    assert plain.exit_code == 0
    assert plain.stdout.strip() == "no GPU telemetry available: NVML unavailable: Driver Not Loaded"
