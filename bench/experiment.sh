#!/usr/bin/env bash
# Experiment: memory-aligned on-policy distillation on CPU with the default model (the last figures:
# bench/results/teacher_context/aligned_vs_persistent.json; the full learning benchmark: docs/learning.md).
#   bash bench/experiment.sh [WORKDIR]
# 1. held-out F1 of the base model (greedy, synthetic tasks of seed 1000);
# 2. one on-policy rollout (seed 0, sampled, groups of G per task);
# 3. distill the base model on it for STEPS steps with the teacher context aligned | persistent |
#    privileged (teacher = the same base model, so `aligned` is a KL anchor to the sampling policy plus
#    the RL term, `persistent` pulls towards the flattened-history teacher, `privileged` towards the teacher
#    that sees the gold answer and evidence);
# 4. held-out F1 of each checkpoint; all results in the eval_results table, with bootstrap 95% intervals.
set -euo pipefail
cd "$(dirname "$0")/.."
work=${1:-experiment}
mkdir -p "$work"
db="sqlite:///$work/experiment.db"
am=".venv/bin/agentmem"
EPISODES=${EPISODES:-8}; GROUP=${GROUP:-4}; STEPS=${STEPS:-8}; EVAL=${EVAL:-32}; LR=${LR:-2e-5}
KNOBS=(--knob context_tokens=160 --knob distractors=1 --knob hops=1)
SHAPE=(--chunk-tokens 96 --memory-tokens 48 --answer-tokens 12 --threads "${THREADS:-1}")
export OMP_NUM_THREADS=${THREADS:-1}

$am eval --model default --env synthetic "${KNOBS[@]}" "${SHAPE[@]}" --episodes "$EVAL" --db "$db"
run=$($am rollout --env synthetic "${KNOBS[@]}" "${SHAPE[@]}" --episodes "$EPISODES" --group-size "$GROUP" \
      --sample-temperature "${TEMPERATURE:-0.7}" --seed 0 --db "$db" | sed -n 's/^run_id=\([0-9a-f]*\).*/\1/p')
echo "rollout run $run"
for ctx in aligned persistent privileged; do
  ckpt=$($am distill --run "$run" --teacher-context "$ctx" --steps "$STEPS" --invocations-per-step 8 --lr "$LR" \
         --out "$work/ckpt-$ctx" --threads "${THREADS:-1}" --db "$db" | sed -n 's/.* checkpoint=\([0-9a-f]*\) .*/\1/p')
  echo "$ctx -> checkpoint $ckpt"
  $am eval --model "$ckpt" --env synthetic "${KNOBS[@]}" "${SHAPE[@]}" --episodes "$EVAL" --db "$db"
done
$am sql "select c.run_id as distill_run, r.config ->> '\$.context' as context, e.step, e.n_episodes, \
  round(e.f1, 3) as f1, round(e.f1_lo, 3) as f1_lo, round(e.f1_hi, 3) as f1_hi, round(e.em, 3) as em, \
  round(e.sub_em, 3) as sub_em from eval_results e left join checkpoints c on c.id = e.checkpoint_id \
  left join runs r on r.id = c.run_id order by e.created_at" --db "$db"
$am sql "select r.config ->> '\$.context' as context, t.step, round(t.loss, 4) as loss, round(t.kd_loss, 4) as kd, \
  round(t.rl_loss, 4) as rl, t.tokens from train_steps t join runs r on r.id = t.run_id order by t.created_at" --db "$db"
