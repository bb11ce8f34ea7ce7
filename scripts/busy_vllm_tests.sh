#!/usr/bin/env bash
# The tests that start real vLLM servers, run beside a CPU hog on every core: what a laptop or a
# shared CI machine does to timing. Usage: scripts/busy_vllm_tests.sh [RUNS] [pytest args...]
# (default: 3 runs of `-m vllm`). Each run prints one summary line; the script exits non-zero
# if any run failed. The hogs are plain busy loops (stress-ng when the machine has it), started
# here and stopped by PID on exit.
set -uo pipefail
cd "$(dirname "$0")/.."
runs="${1:-3}"
shift || true
args=("$@")
[ ${#args[@]} -eq 0 ] && args=(-m vllm)
cores="$(nproc)"
hogs=()
stop_hogs() { for pid in "${hogs[@]}"; do kill "$pid" 2>/dev/null; done; hogs=(); }
trap stop_hogs EXIT
trap 'stop_hogs; exit 130' INT TERM

failed=0
for run in $(seq 1 "$runs"); do
  if command -v stress-ng >/dev/null 2>&1; then
    stress-ng --cpu "$cores" --quiet >/dev/null 2>&1 &
    hogs+=("$!")
  else
    for _ in $(seq 1 "$cores"); do
      python3 -c "while True: pass" &
      hogs+=("$!")
    done
  fi
  log="$(mktemp)"
  .venv/bin/python -m pytest -q -p no:cacheprovider "${args[@]}" >"$log" 2>&1
  rc=$?
  stop_hogs
  echo "busy run $run/$runs (hogs on $cores cores): $(tail -n 1 "$log") rc=$rc"
  if [ "$rc" -ne 0 ]; then
    failed=1
    grep -E "^(FAILED|ERROR)" "$log" || tail -n 40 "$log"
    echo "the whole output: $log"
  else
    rm -f "$log"
  fi
done
exit "$failed"
