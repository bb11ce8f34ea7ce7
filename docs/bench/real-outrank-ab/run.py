"""The real burst (`steersman bench --suite real`) with `dispatch.outrank` on and off, side by
side in one run. From the repository root: `python docs/bench/real-outrank-ab/run.py`."""

import sys

from steersman.control.cli.main import app
from steersman.control.harness import bench_real

keep = {k: bench_real.VARIANTS[k] for k in ("least-load", "vllm-priority", "steersman")}
keep["steersman-outrank-off"] = {"predictions": False, "dispatch": {"outrank": False}}
bench_real.VARIANTS.clear()
bench_real.VARIANTS.update(keep)
sys.argv = ["steersman", "bench", "--suite", "real", "--out", "docs/bench/real-outrank-ab"]
app()
