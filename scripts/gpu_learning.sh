#!/usr/bin/env bash
# The learning plan on one GPU: the pilot (S), then 5 seeds of the core suite at S, records and logs under $OUT
# (default /tmp/gpu_learning_out), sized for 9 minutes on one H100. Needs the committed hint teacher
# (bench/results/learning/teacher/hint) and, on a GPU image without them, the wheels of scripts/gpu_wheels.sh.
#   bash scripts/gpu_learning.sh             # there (the device tool: carry .gpu_wheels)
#   bash scripts/gpu_learning.sh --dry-run   # anywhere: every unit's train commands built and checked, nothing run
# Records land in $OUT/records (host "cuda": apart from the CPU records); copy them into
# bench/results/learning/records/ and run `python -m bench.learning --report` to add them to the report.
set -uo pipefail
cd "$(dirname "$0")/.."
export OUT=${OUT:-${TMPDIR:-/tmp}/gpu_learning_out}
mkdir -p "$OUT"
# shellcheck source=scripts/gpu_env.sh
source scripts/gpu_env.sh
work="$OUT/work"
common=(--device cuda --threads 4 --work "$work" --records "$OUT/records")
if [ "${1:-}" = "--dry-run" ]; then
  common=(--device cpu --threads 1 --work "$work" --records "$OUT/records")
  "$py" -m bench.learning --pilot --dry-run "${common[@]}" || exit 1
  for seed in 0 1 2 3 4; do "$py" -m bench.learning --seed "$seed" --steps 8 --dry-run "${common[@]}" || exit 1; done
  echo "dry run: every unit's commands built"
  exit 0
fi
[ -f bench/results/learning/teacher/hint/adapter_config.json ] || { echo "no committed hint teacher"; exit 1; }
nvidia-smi 2>/dev/null | head -12 | tee "$OUT/gpu.log"
timeout 150 "$py" -m bench.learning --pilot "${common[@]}" 2>&1 | tee "$OUT/pilot.log"
S=$(sed -n 's/^pilot: .* S=\([0-9]*\) stop=\(True\|False\).*/\1 \2/p' "$OUT/pilot.log" | tail -1)
read -r steps stop <<<"${S:-24 True}"
echo "pilot: S=$steps stop=$stop" | tee -a "$OUT/gpu.log"
if [ "$stop" = "True" ]; then echo "the pilot stopped the plan: no seeds" | tee -a "$OUT/gpu.log"; exit 0; fi
for seed in 0 1 2 3 4; do
  timeout 75 "$py" -m bench.learning --seed "$seed" --steps "$steps" "${common[@]}" 2>&1 | tee "$OUT/seed-$seed.log"
done
tail -n 1 "$OUT"/seed-*.log | tee -a "$OUT/gpu.log"
