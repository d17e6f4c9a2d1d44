#!/usr/bin/env bash
# One prepared check of every CUDA path on a GPU machine without network, in about 8 minutes on one
# H100/H200: FlexAttention's tests on CUDA, then bench/gpu.py (exactness in bf16, packed vs padded speed,
# rollout and eval, torchrun DDP/FSDP2 steps, a SQLite store). Results under $OUT (default /tmp/gpu_check_out):
# gpu_check.json, gpu_check.log, pytest_cuda.log, gpu_check.db, wrapped_step.json.
#   bash scripts/gpu_wheels.sh              # here, once: the dependencies the GPU image lacks -> .gpu_wheels/
#   bash scripts/gpu_check.sh               # there (the device tool: carry .gpu_wheels)
#   bash scripts/gpu_check.sh --dry-run     # anywhere: the same code on CPU with a tiny model
# The GPU image's python (torch, transformers, peft, typer, rich, pyarrow, numpy) is kept: the wheels go to
# a separate folder on PYTHONPATH, installed with pip --no-index from .gpu_wheels/ only.
set -uo pipefail
cd "$(dirname "$0")/.."
export OUT=${OUT:-${TMPDIR:-/tmp}/gpu_check_out}
mkdir -p "$OUT"
# shellcheck source=scripts/gpu_env.sh
source scripts/gpu_env.sh
{ "$py" --version; nvidia-smi 2>/dev/null | head -15; } | tee "$OUT/gpu_check.log"
if [ "${1:-}" != "--dry-run" ]; then
  # FlexAttention's CUDA cases: logits in fp32 and bf16, gradients (CI runs the CPU ones)
  timeout 120 "$py" -m pytest -q -p no:cacheprovider tests/agentmem/training/test_flex_attention.py -k cuda \
    >"$OUT/pytest_cuda.log" 2>&1
  echo "pytest tests/agentmem/training/test_flex_attention.py on CUDA: exit $? (tail of $OUT/pytest_cuda.log:)" | tee -a "$OUT/gpu_check.log"
  tail -3 "$OUT/pytest_cuda.log" | tee -a "$OUT/gpu_check.log"
fi
timeout "${GPU_CHECK_TIMEOUT:-380}" "$py" -m bench.gpu --out "$OUT" "$@" 2>&1 | tee -a "$OUT/gpu_check.log"
