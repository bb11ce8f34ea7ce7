"""`steersman bench --suite fleet` as a user runs it: the installed console script."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest


def bench(args: list[str], data: Path, config: Path | None = None) -> subprocess.CompletedProcess:
    steersman = str(Path(sys.executable).with_name("steersman"))
    env = {"PATH": "/usr/bin:/bin", "STEERSMAN_DATA_DIR": str(data)}
    if config is not None:
        env["STEERSMAN_CONFIG"] = str(config)
    return subprocess.run(
        [steersman, "bench", *args], capture_output=True, text=True, env=env, timeout=900
    )


def test_the_fleet_suite_reports_every_scenario_and_policy(tmp_path, tiny_model):
    data = tmp_path / "data"
    config = tmp_path / "steersman.toml"  # the operator's settings are the ones benchmarked
    config.write_text("[dispatch]\naging_s = 16\n")
    shutil.copytree(tiny_model, data / "models" / "tiny-llama")
    out = tmp_path / "out"
    args = ["--suite", "fleet", "--fleet", "1xa100-llama2-7b+1xa30-llama2-7b"]
    args += ["--homogeneous", "2xa100-llama2-7b", "--fleet-scenarios", "throttle,steady,quiet"]
    args += ["--steady-s", "60", "--warmup-s", "15", "--requests", "400"]
    args += ["--train-budget", "10", "--out", str(out)]
    done = bench(args, data, config)
    assert done.returncode == 0, done.stderr[-3000:]
    results = json.loads((out / "results.json").read_text())
    assert results["dispatch_changed"] == {"aging_s": 16.0}
    fleet = results["fleet"]
    assert list(fleet["scenarios"]) == ["throttle", "steady", "quiet"]
    for scenario, runs in fleet["scenarios"].items():
        assert runs["rate_rps"] > 0
        policies = {"least-load", "steersman", "steersman-frozen"}
        if scenario == "steady":
            policies.add("steersman-no-telemetry")
            assert runs.pop("seeds")["seeds"] == 5
        if scenario == "quiet":
            policies.add("steersman-remembers")
            assert runs["level"] == 0.1 and "instance0_after_change" in runs["steersman"]
        assert set(runs) - {"rate_rps", "level"} == policies
        for name in policies:
            assert sum(runs[name]["served_by"]) == runs[name]["measured"] > 0
    assert "tracking" in fleet["scenarios"]["throttle"]["steersman"]
    assert fleet["floor"]["measured"] == fleet["scenarios"]["throttle"]["least-load"]["measured"]
    report = (out / "report.md").read_text()
    assert "`[dispatch]` settings changed from the defaults: `aging_s = 16.0`" in report
    assert "## Fleets that differ and GPUs that slow down" in report
    assert "2xa100-llama2-7b, throttle: instance 0's clock capped at 60%" in report
    assert "| steersman-frozen | " in report and "tracked after |" in report
    assert "2xa100-llama2-7b, quiet: at light load" in report
    assert "| steersman-remembers | " in report


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--fleet", "4xnope"], "--fleet: fleet '4xnope': unknown simulator profile 'nope'"),
        (["--homogeneous", "eight"], "--homogeneous: fleet 'eight': part 'eight' is not"),
        (["--fleet-scenarios", "melt"], "--fleet-scenarios: unknown fleet scenario 'melt'"),
    ],
)
def test_a_bad_fleet_option_is_one_line_naming_it(tmp_path, args, says):
    done = bench(["--suite", "fleet", *args], tmp_path / "data")
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and says in lines[0], done.stderr
    assert not (tmp_path / "data" / "models").exists()  # refused before anything ran


def test_a_bad_dispatch_setting_is_refused_naming_it(tmp_path):
    config = tmp_path / "steersman.toml"
    config.write_text("[dispatch]\naging_s = -1\n")
    done = bench(["--suite", "sim"], tmp_path / "data", config)
    assert done.returncode != 0
    assert "dispatch.aging_s" in done.stderr and "-1" in done.stderr, done.stderr
    assert not (tmp_path / "data" / "models").exists()
