"""`steersman calibrate`: the fit on known step times, and a real vLLM CPU server measured."""

from __future__ import annotations

import json
import math
import statistics
import time

import pynvml
import pytest
from typer.testing import CliRunner

from steersman.control.backends.vllm_server import free_port
from steersman.control.cli.main import app
from steersman.control.harness.calibrate import Sample, fit
from steersman.control.sim.profiles import StepModel, load_profile
from tests.telemetry.fake_nvml import FakeGpu, FakeNvml

runner = CliRunner()

TRUE = StepModel(
    "true", a=0.002, b=1e-5, c=1e-4, d=1e-7, e=0.003, admission_s=0.002, wake_s=0.004,
    num_blocks=100,
)  # fmt: skip


def _samples(m: StepModel) -> list[Sample]:
    """What a server that follows ``m`` exactly would measure."""

    def step(seqs: int, context: float) -> float:
        return m.a + m.c * seqs + m.d * context

    out = [
        Sample("prefill", 1, p, p, m.admission(False) + m.a + m.e + m.b * p)
        for p in (16, 128, 256, 512, 896)
    ]
    out += [
        Sample("decode", k, p, k * (p + 32), step(k, k * (p + 32)))
        for k, p in ((1, 16), (4, 16), (16, 16), (32, 16), (4, 384), (16, 384))
    ]
    for p in (16, 256):
        context = 4 * (16 + 400)
        out.append(Sample("join", 4, p, context, m.e + m.b * p))
        busy = m.admission(True) + 1.5 * step(4, context) + m.e + m.b * p
        out.append(Sample("busy-prefill", 4, p, context, busy))
    return out


def test_fit_recovers_every_coefficient_of_the_step_model():
    got = fit(_samples(TRUE), "fitted", num_blocks=100, max_model_len=1024)
    for field in ("a", "b", "c", "d", "e", "admission_s", "wake_s"):
        assert getattr(got, field) == pytest.approx(getattr(TRUE, field), rel=1e-6), field
    assert got.name == "fitted" and got.max_model_len == 1024


def test_fit_without_join_measurements_puts_everything_in_the_idle_admission():
    samples = [s for s in _samples(TRUE) if s.kind in ("prefill", "decode")]
    got = fit(samples, "old", num_blocks=100, max_model_len=1024)
    assert (got.e, got.wake_s) == (0.0, 0.0)
    assert got.admission_s == pytest.approx(TRUE.admission(False) + TRUE.e)


def test_joins_measured_too_slow_cannot_put_the_idle_ttft_above_the_measured_one():
    # A busy machine inflates what each join adds eightfold: the idle prefill measurements
    # still bound the step, so the profile keeps the server's idle time to first token.
    samples = [
        Sample(s.kind, s.seqs, s.prompt_tokens, s.context_tokens, s.seconds * 8)
        if s.kind == "join"
        else s
        for s in _samples(TRUE)
    ]
    got = fit(samples, "noisy", num_blocks=100, max_model_len=1024)
    assert got.e > TRUE.e
    for s in samples:
        if s.kind == "prefill":
            idle_ttft = got.admission(False) + got.a + got.e + got.b * s.prompt_tokens
            assert idle_ttft == pytest.approx(s.seconds, rel=1e-6)


def test_an_unreachable_server_is_a_clear_failure_that_writes_nothing(tmp_path):
    out = tmp_path / "p.json"
    url = f"http://127.0.0.1:{free_port()}"
    result = runner.invoke(app, ["calibrate", "--base-url", url, "--out", str(out)])
    assert result.exit_code == 1
    assert "calibration failed" in result.output and url in result.output
    assert not out.exists()


@pytest.mark.parametrize(
    ("gpus", "init_error", "why"),
    [([], pynvml.NVML_ERROR_DRIVER_NOT_LOADED, "NVML unavailable"), ([FakeGpu(0)], None, "1 GPU")],
)
def test_a_gpu_that_cannot_be_read_fails_before_measuring(
    monkeypatch, tmp_path, gpus, init_error, why
):
    FakeNvml(gpus, time.monotonic, init_error=init_error).install(monkeypatch)
    out = tmp_path / "gpu.json"
    url = f"http://127.0.0.1:{free_port()}"  # never asked: the GPU is checked first
    result = runner.invoke(app, ["calibrate", "--base-url", url, "--out", str(out), "--gpu", "3"])
    assert result.exit_code == 1
    assert "--gpu 3" in result.output and why in result.output
    assert url not in result.output and not out.exists()


@pytest.mark.vllm
def test_calibrate_a_live_vllm_server_writes_a_loadable_profile(
    vllm_servers, tmp_path, monkeypatch
):
    # The server runs on the CPU; the GPU it names is simulated at pynvml's function boundary,
    # busy half the time (a slow wave of SM activity) at a clock below the A100's boost.
    FakeNvml([FakeGpu(0, sm_clock=1275)], time.monotonic).install(monkeypatch)
    out = tmp_path / "cpu.json"
    result = runner.invoke(
        app,
        [
            "calibrate", "--base-url", vllm_servers[0].url, "--out", str(out), "--repeats", "1",
            "--gpu", "0",
        ],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    kinds = [s["kind"] for s in report["samples"]]
    assert kinds.count("prefill") == 5 and kinds.count("decode") == 10
    assert kinds.count("join") == 2 and kinds.count("busy-prefill") == 2
    profile = load_profile(str(out))
    assert profile.name == "calibrated" and profile.max_model_len == 1024
    assert profile.clock_mhz == 1275.0  # the clock the GPU held while busy
    # The server's KV capacity, read from its metrics, in 16-token blocks.
    assert profile.num_blocks > 1000
    # One live measurement is noisy on a shared machine: the fit itself is checked exactly on
    # synthetic samples above; here, only that what came out is a usable profile.
    for field in ("a", "b", "c", "d", "e", "admission_s", "wake_s"):
        value = getattr(profile, field)
        assert math.isfinite(value) and value >= 0, field
    assert profile.a > 0
    # Over the five prefill lengths, the model's time to first token is of the order of the
    # server's: the median ratio, not any one sample.
    ratios = [
        (profile.admission(False) + profile.a + profile.e + profile.b * s["prompt_tokens"])
        / s["seconds"]
        for s in report["samples"]
        if s["kind"] == "prefill"
    ]
    assert 0.5 < statistics.median(ratios) < 2.0, ratios
