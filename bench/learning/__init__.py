"""The learning benchmark: does on-policy distillation add to SFT, does the RL term fire, does alignment
matter, and does any of it transfer to real text?

Every trained arm starts from the same **warm start** (the default model after ``--warm-steps`` SFT steps on
oracle calls of the synthetic ladder, levels ``train_levels``) and then gets the same budget (``steps``
optimiser steps of ``calls_per_step`` stored calls, fresh rollouts every ``steps_per_round`` steps, one
warmup + cosine schedule at ``lr``, AdamW going on from the warm start's state and carried across rounds), for
each of ``--seeds`` training seeds:

  base                  the default model, untrained (once);
  warm                  the warm start itself (the yardstick of the methods: each must add to it);
  momentum              the null method: the warm start's carried AdamW run for the methods' steps and schedule
                        with zero gradients (the move every method makes before its own gradient counts);
  teacher_ladder        the validated ladder teacher itself (once): how far a student could follow it;
  sft_more              SFT continued on the oracle calls;
  seqkd                 off-policy distillation: SFT on the teacher's own samples of the same tasks, each round;
  opd_aligned           on-policy distillation, the teacher in the student's own state (MemOPD);
  opd_persistent        the teacher on the flattened episode history, every call;
  opd_persistent_update the persistent teacher on update calls only (answer calls aligned);
  opd_persistent_answer the persistent teacher on answer calls only (update calls aligned);
  opd_persistent_chat   the teacher on the history as one chat;
  opd_privileged        the teacher also shown the gold answer and evidence (PSD on-policy);
  opd_privileged_grpo   opd_privileged + the RL term;
  grpo                  the RL term only (group-relative advantages, groups of ``group``);
  opd_grpo              aligned on-policy distillation + the RL term;
  opd_centered          opd_aligned with the teacher's push centred at first tokens (``teacher_centering``): minus its
                        mean over the step's calls of the same kind, so it moves how calls differ, not what they share;
  opd_grpo_centered     opd_centered + the RL term;
  opd_centered_memory   opd_centered with the mean taken over the calls of the same kind whose memory was empty too
                        (or held something too): the calls that face the same decision;
  opd_grpo_centered_memory opd_centered_memory + the RL term;
  opd_privileged_centered_memory opd_privileged with opd_centered_memory's centring: the privileged teacher tells an
                        evidence read from another one, and the centring keeps only where its pushes differ;
  opd_privileged_grpo_centered_memory opd_privileged_centered_memory + the RL term;
  psd_off               PSD off-policy: the teacher's samples under the privileged prompt;
  reopd                 ReOPD: the student samples one call per oracle episode from the oracle's memory;
  squad_warm            real text: the warm start's SFT, on SQuAD oracle calls instead of the ladder;
  squad_opd             real text: squad_warm, then aligned OPD on SQuAD rollouts with a SQuAD teacher;
  teacher_rl, teacher_hint  T_rl (per seed) and T_hint themselves, evaluated (T_hint under its hint prompt);
  opd_t0, opd_rl, opd_hint  aligned OPD from T0 (the warm start itself), T_rl and T_hint;
  seqkd_rl, seqkd_hint  SFT on T_rl's and T_hint's samples (T_hint's under its hint prompt);
  opd_grpo_hint         the RL term with T_hint in its advantage (kd_form advantage, c picked on validation);
  grpo_long             the RL term for the method budget plus T_rl's RL steps (T_rl's arms at equal compute).

Teachers with headroom: T_rl (each seed's warm start, then the RL term alone for ``rl_teacher_steps``, about 10x
the method budget, picked on validation) and T_hint (SFT under the ``hint`` prompt: before each memory update one
line saying whether its chunk states a fact about the question's entity; ``agentmem sft --context hint``; the
student never reads it) distil only past their gate per seed (``teachers.gate``: validation F1 at least warm +
0.10, first-read decision gap at least 0.5, empty outputs and first-token EOS mass bounded). ``--pilot`` runs the
gap-recovery pilot (one seed; opd_rl, opd_hint, sft_more and grpo evaluated at 8, 24 and 64 steps): S is the first
point where OPD recovers 30% of a teacher's gap, and if none does, nothing more should run.

The teacher of the ladder arms is the default model fine-tuned on oracle calls for longer; it is
**validated before any arm uses it** (``agentmem.jobs.teacher_check``): each candidate checkpoint
(``teacher_steps``) is evaluated greedily on validation tasks, with its F1, its end-of-sequence-only output
rate and its first-token EOS mass per call kind; the best F1 among those with an empty rate at most
``max_teacher_empty`` on every kind is picked, and the run stops when none qualifies. The SQuAD arm's
teacher is chosen the same way on SQuAD. With ``--privileged-teacher-sft`` the privileged arms (``opd_privileged``,
``opd_privileged_grpo``, ``psd_off``) get a teacher of their own: the default model fine-tuned on the same oracle calls under the
privileged prompt it then reads (``agentmem sft --context privileged``), validated under it and picked by the
fewest ``(empty)`` updates after evidence (its answer call reads the gold answer, so its F1 says little).

Held-out sets are independent: ladder level ``L`` is seed ``HELD_OUT_SEED + L`` with ``names=heldout``
(entity names that no training task can contain: ``envs/synthetic.py``), training and teacher tasks use
``names=train`` and seeds of their own (oracle: 7000 + level; rollouts: 100 + 10 x seed + round). Real text:
the shared HotpotQA file's questions with their gold paragraphs (``hotpotqa``) and the ``ruler_hotpotqa``
form at 10 documents (``ruler10``), when ``../shared`` is there. Intervals resample whole questions and
training seeds (``envs.metrics.cluster_bootstrap``); differences between arms are paired.

Outputs in ``WORK``: ``learning.md`` (tables), ``learning.json`` (their values), ``dynamics.png`` (per arm:
live RL groups, first-token EOS mass, output length, KL to the teacher and to the round's start, against the
step), ``gap_recovery.png`` (``--pilot``), ``learning.db`` (every run, call, step and eval, for SQL),
``state.json`` (finished phases: run again on the same folder and a killed run goes on). Each finished arm-seed
and each teacher's gate writes a JSON record (``records``; ``--records DIR``, default
bench/results/learning/records); the report's last section and the last line are built from the records of the
run's config hash: ``gap_rl= gap_hint= recovery_rl= recovery_hint= opd_minus_sft_more= opd_minus_seqkd=
t0_minus_momentum= opd_rl_minus_rl= aligned_minus_persistent= dose_slope= seeds=``.

  python -m bench.learning --smoke --work /tmp/learning-smoke   # every phase on a tiny model
  python -m bench.learning --quick --work learning-quick --jobs 2
  python -m bench.learning --pilot --work learning-pilot --jobs 2
  python -m bench.learning --work learning --seeds 5 --steps S --jobs 2
"""

from bench.learning.arms import Bench, MissingCheckpoint, coast, open_bench
from bench.learning.plan import (
    ALWAYS,
    ARMS,
    BASE_AFTER,
    ON_POLICY,
    QUICK_ARMS,
    RUN_ORDER,
    Plan,
    arm_seeds,
    make_plan,
    task_order,
    teacher_keys,
)
from bench.learning.teachers import NoTeacher

__all__ = ["ALWAYS", "ARMS", "BASE_AFTER", "ON_POLICY", "QUICK_ARMS", "RUN_ORDER", "Bench", "MissingCheckpoint",
           "NoTeacher", "Plan", "arm_seeds", "coast", "make_plan", "open_bench", "task_order", "teacher_keys"]
