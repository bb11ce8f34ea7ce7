"""`steersman demo --backend sim`: the newcomer's path end to end, on a fresh data directory."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

from sqlalchemy import text

from steersman.storage.engine import make_engine


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
    assert (data / "models" / "demo-roberta" / "steersman.json").exists()  # cached for next time
