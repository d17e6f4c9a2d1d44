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
  squad_opd             real text: squad_warm, then aligned OPD on SQuAD rollouts with a SQuAD teacher.

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
step), ``learning.db`` (every run, call, step and eval, for SQL), ``state.json`` (finished phases: run again on
the same folder and a killed run goes on). The last line:
``warm_minus_base= aligned_minus_warm= aligned_minus_persistent= opd_rl_minus_rl= rl_live_fraction=
hotpot_trained_minus_base= seeds=``.

  python -m bench.learning --quick --work learning-quick --jobs 2   # 28-51 min on 2 cores with native bf16, ~105 without
  python -m bench.learning --work learning --seeds 3 --jobs 2
  python -m bench.learning --smoke --work /tmp/learning-smoke   # every phase on a tiny model
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import torch

from agentmem import models
from agentmem.config import (
    HELD_OUT_SEED,
    AgentConfig,
    DistillConfig,
    Divergence,
    DType,
    EvalConfig,
    LrSchedule,
    Oversize,
    PolicySource,
    PsdMode,
    ReplayConfig,
    RewardKind,
    RLKind,
    RolloutConfig,
    SftConfig,
    TeacherCentering,
    TeacherTruncation,
)
from agentmem.jobs.distill import run_distill
from agentmem.jobs.eval import first_read_skips, run_eval
from agentmem.jobs.replay import run_replay
from agentmem.jobs.rollout import build_env, run_rollout
from agentmem.jobs.sft import run_sft
from agentmem.jobs.teacher_check import check_teacher
from agentmem.records import Checkpoint, SamplingContext, TeacherContext
from agentmem.runtime import Runtime
from agentmem.training.checkpoints import carry_trainer_state, save_checkpoint
from agentmem.training.dynamics import EMPTY_WARN, round_warnings
from agentmem.training.schedule import lr_at
from bench.common.phases import State, say
from bench.common.tiny import tiny_model
from envs.metrics import cluster_bootstrap
from store import repository as repo
from store.engine import open_store

ROOT = Path(__file__).resolve().parents[1]

# in the order they run (the paper's questions first, so a partial run answers them)
LADDER_ARMS = ("opd_aligned", "grpo", "opd_grpo", "sft_more", "seqkd", "opd_persistent", "opd_persistent_update",
               "opd_persistent_answer", "opd_persistent_chat", "opd_privileged", "opd_privileged_grpo", "psd_off", "reopd",
               "opd_centered", "opd_grpo_centered", "opd_centered_memory", "opd_grpo_centered_memory",
               "opd_privileged_centered_memory", "opd_privileged_grpo_centered_memory")
ARMS = ("base", "warm", "momentum", "teacher_ladder", *LADDER_ARMS, "squad_warm", "squad_opd")
ALWAYS = ("base", "warm", "momentum")  # the yardsticks: every run has them, whatever --arms says
# the base model's evaluation starts after these (task_order): the ladder arms of the last line
BASE_AFTER = ("opd_aligned", "grpo", "opd_grpo", "opd_persistent")
# --quick's arms: the paper's comparisons (the last line's arms, SFT continued, off-policy distillation, every
# persistent context, PSD on- and off-policy, ReOPD, the teacher itself) and the best distillation arm measured so
# far; the other ablations (the RL term beside a privileged or centred teacher, centring by kind) run in the full
# plan or with --arms, so that --quick does not grow with every ablation
QUICK_ARMS = ("base", "warm", "momentum", "teacher_ladder", "opd_aligned", "grpo", "opd_grpo", "opd_persistent",
              "sft_more", "seqkd", "opd_persistent_update", "opd_persistent_answer", "opd_persistent_chat",
              "opd_privileged", "psd_off", "reopd", "opd_centered_memory", "squad_warm", "squad_opd")
# the order --jobs starts them in: the last line's arms first (a partial run answers the benchmark's goals),
# then the other comparisons
RUN_ORDER = ("warm", "momentum", "teacher_ladder", "opd_aligned", "grpo", "opd_grpo", "opd_persistent", "squad_warm", "squad_opd",
             "sft_more", "seqkd", "opd_persistent_update", "opd_persistent_answer", "opd_persistent_chat", "opd_privileged",
             "opd_privileged_grpo", "psd_off", "reopd", "opd_centered", "opd_grpo_centered", "opd_centered_memory",
             "opd_grpo_centered_memory", "opd_privileged_centered_memory", "opd_privileged_grpo_centered_memory")
# what each on-policy arm sets in DistillConfig (kd: a teacher term; rl: the GRPO term)
ON_POLICY: dict[str, dict] = {
    "opd_aligned": {"kd": True},
    "opd_persistent": {"kd": True, "context": TeacherContext.persistent},
    "opd_persistent_update": {"kd": True, "context": TeacherContext.persistent, "aligned_kinds": ["answer"]},
    "opd_persistent_answer": {"kd": True, "context": TeacherContext.persistent, "aligned_kinds": ["memory_update"]},
    "opd_persistent_chat": {"kd": True, "context": TeacherContext.persistent_chat},
    "opd_privileged": {"kd": True, "context": TeacherContext.privileged},
    "grpo": {"rl": True},
    "opd_grpo": {"kd": True, "rl": True},
    "opd_privileged_grpo": {"kd": True, "rl": True, "context": TeacherContext.privileged},
    "opd_centered": {"kd": True, "teacher_centering": TeacherCentering.first_token},
    "opd_grpo_centered": {"kd": True, "rl": True, "teacher_centering": TeacherCentering.first_token},
    "opd_centered_memory": {"kd": True, "teacher_centering": TeacherCentering.first_token_memory},
    "opd_grpo_centered_memory": {"kd": True, "rl": True, "teacher_centering": TeacherCentering.first_token_memory},
    "opd_privileged_centered_memory": {"kd": True, "context": TeacherContext.privileged,
                                       "teacher_centering": TeacherCentering.first_token_memory},
    "opd_privileged_grpo_centered_memory": {"kd": True, "rl": True, "context": TeacherContext.privileged,
                                            "teacher_centering": TeacherCentering.first_token_memory},
    "psd_off": {"kd": True, "context": TeacherContext.privileged, "psd": PsdMode.off_policy},
    "reopd": {"kd": True},
    "seqkd": {"seqkd": True},  # cross-entropy on the teacher's samples (no teacher term)
    "squad_opd": {"kd": True},
}
RL_ARMS = ("grpo", "opd_grpo", "opd_privileged_grpo", "opd_grpo_centered", "opd_grpo_centered_memory",
           "opd_privileged_grpo_centered_memory")
REAL_ARMS = ("base", "warm", "opd_aligned", "squad_warm", "squad_opd")  # evaluated on real text too
SHARED = ROOT.parent / "shared" / "data"
HOTPOT = SHARED / "hotpotqa" / "hotpot_dev_distractor_v1_first103.json"
SQUAD = SHARED / "squad" / "dev-v1.1.json"
ORACLE_SEED = 7000
VALIDATION_SEED = 9000


@dataclass(frozen=True)
class Plan:
    """Every knob of one benchmark run (stored in ``state.json``; a resumed run must match it)."""

    seeds: int
    warm_steps: int
    steps: int
    steps_per_round: int
    calls_per_step: int  # stored calls per optimiser step of the methods after the warm start
    rollout_tasks: int  # training tasks per on-policy round (each sampled ``group`` times)
    group: int
    heldout_per_level: int
    heldout_real: int  # questions per real-text component
    teacher_steps: list[int]  # candidate teacher checkpoints (SFT steps on oracle calls)
    teacher_val: int  # validation episodes of each teacher candidate
    train_levels: list[int] = field(default_factory=lambda: [1, 2, 3])
    heldout_levels: list[int] = field(default_factory=lambda: [1, 2, 3])
    # with the warm start's AdamW carried, 2e-5 was best or equal for opd_aligned on every seed (full plan, 3
    # seeds: aligned - warm +0.032, against -0.004 at 5e-5) and equal for sft_more (+0.060 against +0.062);
    # grpo at 2e-5 with groups of 8: +0.082 [+0.021, +0.157] over warm (bench/results/learning/legacy.json)
    lr: float = 2e-5
    warm_lr: float = 5e-5  # 8 steps at 2e-5 left the warm start writing `(empty)` and the RL term dead (probe)
    warmup: int = 1
    # stored calls per SFT step of the warm start and the teacher (kept apart from ``calls_per_step``, so a
    # recipe that changes the methods' batch starts from the same warm start and teacher)
    warm_calls_per_step: int = 8
    # every method after the warm start goes on with the warm start's AdamW state (moments and step count) instead
    # of a fresh one, whose first step moves every weight by about the learning rate whatever its gradient
    carry_warm_optimizer: bool = True
    # False: the carried state's first moment (the warm start's running mean of SFT gradients) starts at zero, its
    # second moment and step count kept, so the null move is zero and a method's update is its own gradients'
    # (with it carried, much of every method's move is the warm start's momentum: the momentum arm)
    carry_warm_first_moment: bool = True
    chunk_tokens: int = 128
    memory_tokens: int = 48
    # SQuAD arms: single-paragraph reading (the gold paragraph alone) with room for a whole evidence sentence
    # (at 10 documents and 48 tokens the oracle left 59% of its updates `(empty)`: no teacher qualified)
    squad_docs: int = 1
    squad_memory_tokens: int = 96
    answer_tokens: int = 16
    temperature: float = 1.0
    # the teacher term's divergence at the student's sampled tokens. Forward KL covers the teacher's modes;
    # reverse KL (MemOPD's) picks one, and with a teacher split between `(empty)` and the fact at an update
    # after evidence it drove every update to `(empty)` within one step (quick run: F1 0.000, against 0.250
    # with forward KL from the same warm start, teacher and rollouts: docs/learning.md)
    loss: str = "forward_kl"
    # the teacher's log-probs divided by this before the divergence (below 1: towards its greedy choice, which is
    # what the greedy evaluation measures; DistillConfig.teacher_temperature)
    teacher_temperature: float = 1.0
    # positions where the teacher's top probability is below this get no teacher term (the RL term still
    # applies): the teacher is left out where it is split (DistillConfig.teacher_min_confidence)
    teacher_min_confidence: float = 0.0
    # the teacher term's weight in an arm that also has the RL term (opd_grpo, opd_privileged_grpo); the RL term keeps
    # weight 1. Alone a term's weight is moot under AdamW; beside the RL term it sets the balance (the teacher term's
    # gradient norm is 1.3-13.7 against 0-2.2 for the RL term's, and opd_grpo followed the teacher)
    rl_kd_weight: float = 1.0
    # the privileged arms' teacher (opd_privileged, opd_privileged_grpo, psd_off): True, the default model fine-tuned
    # on the oracle calls under the privileged prompt it distils with (gold answer and evidence spliced before every
    # prompt), picked on validation under that prompt; False, the ladder teacher (fine-tuned on the plain prompt)
    # reading a splice it never saw in training. The SFT one writes `(empty)` after evidence on 0.06 of its
    # validation updates (plain: 0.38), yet its students drift to `(empty)` as opd_aligned's do (docs/learning.md),
    # so the default stays the plan the earlier folders were made with
    privileged_teacher_sft: bool = False
    max_teacher_empty: float = 0.02
    # a teacher writing `(empty)` on more of its updates made after evidence is refused (quick run: 0.92 at SFT
    # step 16 against 0.16 at step 24, at the same F1); ties on F1 go to the one that drops less
    max_teacher_forgot: float = 0.5
    # greedy evaluations and teacher checks in the faster dtype (auto: measured once, kept in state.json);
    # sampled rollouts stay float32, so their stored log-probs match the float32 training recompute
    eval_dtype: str = "auto"
    # every training job (warm start, teachers, methods) with its decoders in bfloat16 autocast and float32 weights,
    # optimiser and head (DistillConfig.mixed_precision): 1.6x (this bench's step) to 2x (long rows) faster where bf16
    # is native, slower where it is emulated. off, on, or auto (on where the measured faster dtype is bfloat16: Bench.mixed). Earlier folders
    # trained in float32, so the default stays off (--quick: auto)
    mixed_precision: str = "off"
    model: str = "default"
    hotpot: str | None = None
    squad: str | None = None
    arms: list[str] = field(default_factory=lambda: list(ARMS))

    @property
    def rounds(self) -> int:
        return self.steps // self.steps_per_round

    @property
    def coasts(self) -> bool:
        """Whether the warm start's carried state moves the weights with zero gradients (the momentum arm's
        null move is non-zero): only when its first moment is carried."""
        return self.carry_warm_optimizer and self.carry_warm_first_moment

    def agent(self, temperature: float, seed: int, domain: str = "ladder") -> AgentConfig:
        memory = self.squad_memory_tokens if domain == "squad" else self.memory_tokens
        return AgentConfig(memory_tokens=memory, answer_max_new_tokens=self.answer_tokens,
                           temperature=temperature, seed=seed, max_batch=32)


def make_plan(args: argparse.Namespace, model: str) -> Plan:
    hotpot = args.hotpot or (str(HOTPOT) if HOTPOT.exists() else None)
    squad = args.squad or (str(SQUAD) if SQUAD.exists() else None)
    common = {"model": model, "hotpot": hotpot, "squad": squad}
    if args.smoke:  # every phase on a tiny random model; its numbers mean nothing
        plan = Plan(seeds=1, warm_steps=1, steps=2, steps_per_round=1, calls_per_step=4, rollout_tasks=2, group=2,
                    heldout_per_level=2, heldout_real=1, teacher_steps=[1, 2], teacher_val=2, train_levels=[1, 2],
                    heldout_levels=[1, 2], chunk_tokens=48, memory_tokens=8, answer_tokens=4, warm_calls_per_step=4,
                    max_teacher_empty=1.0, max_teacher_forgot=1.0, eval_dtype="float32", **common)
    elif args.quick:
        plan = Plan(seeds=1, warm_steps=16, steps=4, steps_per_round=2, calls_per_step=8, rollout_tasks=4, group=8,
                    heldout_per_level=12, heldout_real=12, teacher_steps=[16, 24, 32], teacher_val=8,
                    mixed_precision="auto", arms=[a for a in ARMS if a in QUICK_ARMS], **common)
    else:
        # the recipe measured best on three seeds (bench/results/learning/legacy.json): 24 calls per method step
        # (8: the first step's noise decided the seed), groups of 8 (RL live 0.60, against 0.33 with 4), and a
        # teacher chosen among 32/64/96 SFT steps on 32 validation episodes (16/24/32 on 12 left none with headroom)
        plan = Plan(seeds=3, warm_steps=16, steps=8, steps_per_round=2, calls_per_step=24, rollout_tasks=4, group=8,
                    heldout_per_level=32, heldout_real=40, teacher_steps=[32, 64, 96], teacher_val=32, **common)
    updates: dict = {k: v for k, v in (("lr", args.lr), ("seeds", args.seeds), ("steps", args.steps),
                                       ("heldout_per_level", args.heldout_per_level),
                                       ("heldout_real", args.heldout_real),
                                       ("eval_dtype", args.eval_dtype), ("warm_steps", args.warm_steps),
                                       ("warm_lr", args.warm_lr), ("loss", args.loss),
                                       ("teacher_val", args.teacher_val), ("group", args.group),
                                       ("calls_per_step", args.calls_per_step),
                                       ("teacher_temperature", args.teacher_temperature),
                                       ("teacher_min_confidence", args.teacher_min_confidence),
                                       ("rl_kd_weight", args.rl_kd_weight),
                                       ("privileged_teacher_sft", args.privileged_teacher_sft),
                                       ("carry_warm_optimizer", args.carry_warm_optimizer),
                                       ("carry_warm_first_moment", args.carry_warm_first_moment),
                                       ("mixed_precision", args.mixed_precision)) if v is not None}
    if args.teacher_steps:
        try:
            updates["teacher_steps"] = sorted({int(x) for x in args.teacher_steps.split(",") if x})
        except ValueError:
            raise SystemExit(f"--teacher-steps: comma-separated integers, got {args.teacher_steps!r}") from None
        if not updates["teacher_steps"] or min(updates["teacher_steps"]) < 1:
            raise SystemExit(f"--teacher-steps: positive integers, got {args.teacher_steps!r}")
    if args.group is not None and args.group < 2:
        raise SystemExit(f"--group: at least 2 samples per task (an advantage needs a group), got {args.group}")
    if args.teacher_temperature is not None and not args.teacher_temperature > 0:
        raise SystemExit(f"--teacher-temperature: a positive number, got {args.teacher_temperature}")
    if args.teacher_min_confidence is not None and not 0 <= args.teacher_min_confidence < 1:
        raise SystemExit(f"--teacher-min-confidence: a probability in [0, 1), got {args.teacher_min_confidence}")
    if args.rl_kd_weight is not None and not args.rl_kd_weight > 0:
        raise SystemExit(f"--rl-kd-weight: a positive weight, got {args.rl_kd_weight} (opd_grpo without the teacher "
                         "term is grpo)")
    if args.calls_per_step is not None and args.calls_per_step < 1:
        raise SystemExit(f"--calls-per-step: a positive number of stored calls, got {args.calls_per_step}")
    if args.teacher_val is not None and args.teacher_val < 1:
        raise SystemExit(f"--teacher-val: a positive number of episodes, got {args.teacher_val}")
    if args.arms:
        arms = [a for a in args.arms.split(",") if a]
        unknown = sorted(set(arms) - set(ARMS))
        if unknown:
            raise SystemExit(f"--arms: unknown {unknown}; known: {', '.join(ARMS)}")
        updates["arms"] = [a for a in ARMS if a in arms or a in ALWAYS]
    plan = Plan(**{**asdict(plan), **updates})
    if not plan.carry_warm_first_moment and not plan.carry_warm_optimizer:
        raise SystemExit("--no-carry-warm-first-moment drops the first moment of the carried warm-start AdamW state: "
                         "it needs the state carried (leave out --no-carry-warm-optimizer)")
    if plan.steps % plan.steps_per_round:
        raise SystemExit(f"steps ({plan.steps}) must be a multiple of steps_per_round ({plan.steps_per_round})")
    if plan.rounds > 10:  # rollout seeds are 100 + 10 x seed + round: an 11th round would take the next seed's tasks
        raise SystemExit(f"--steps: at most 10 rounds of {plan.steps_per_round} steps (the seeds' rollout tasks are "
                         f"10 apart), got {plan.steps} steps ({plan.rounds} rounds)")
    if not plan.squad:
        plan = Plan(**{**asdict(plan), "arms": [a for a in plan.arms if not a.startswith("squad")]})
    return plan


class NoTeacher(Exception):
    """No teacher candidate of a domain passed the check."""


class MissingCheckpoint(Exception):
    """A finished phase's checkpoint folder was deleted: the phases that start or distil from it cannot run."""


@dataclass
class Bench:
    store: object
    runtime: Runtime
    plan: Plan
    work: Path
    state: State
    heldout_tasks: dict[str, dict] = field(default_factory=dict)  # component -> task id -> Task (first_reads)

    # -- configs -------------------------------------------------------------------------------------------

    def ladder(self, level: int, names: str) -> dict:
        return {"level": level, "names": names}

    def heldout_sets(self, real: bool) -> list[tuple[str, EvalConfig]]:
        p = self.plan
        sets = [(f"level{lv}", EvalConfig(env="synthetic", env_knobs=self.ladder(lv, "heldout"), episodes=p.heldout_per_level,
                                          seed=HELD_OUT_SEED + lv, chunk_tokens=p.chunk_tokens,
                                          agent=p.agent(0.0, HELD_OUT_SEED)))
                for lv in p.heldout_levels]
        if real and p.hotpot:
            for name, env, knobs in (("hotpotqa", "hotpotqa", {"docs": 2}), ("ruler10", "ruler_hotpotqa", {"docs": 10})):
                sets.append((name, EvalConfig(env=env, data=p.hotpot, env_knobs=knobs, episodes=p.heldout_real,
                                              chunk_tokens=p.chunk_tokens, agent=p.agent(0.0, HELD_OUT_SEED))))
        return sets

    def training_rollout(self, domain: str, level: int, seed: int) -> RolloutConfig:
        p = self.plan
        if domain == "squad":
            return RolloutConfig(env="squad", data=p.squad, env_knobs={"docs": p.squad_docs}, episodes=p.rollout_tasks,
                                 group_size=p.group, seed=seed, chunk_tokens=p.chunk_tokens,
                                 agent=p.agent(p.temperature, seed, "squad"))
        return RolloutConfig(env="synthetic", env_knobs=self.ladder(level, "train"), episodes=p.rollout_tasks,
                             group_size=p.group, seed=seed, chunk_tokens=p.chunk_tokens,
                             agent=p.agent(p.temperature, seed))

    # -- phases --------------------------------------------------------------------------------------------

    def eval_dtype(self) -> str:
        def measure() -> str:
            if self.plan.eval_dtype != "auto":
                return self.plan.eval_dtype
            choice = models.auto_dtype(self.store, self.plan.model)
            say(f"evaluations in {choice.dtype} ({choice.reason})")
            return choice.dtype
        return self.state.once("eval_dtype", measure)

    def fast_dtype(self) -> str:
        """The faster dtype of the model on this machine (``models.auto_dtype``), measured once: the evaluations'
        measurement when theirs is ``auto``."""
        if self.plan.eval_dtype == "auto":
            return self.eval_dtype()

        def measure() -> str:
            choice = models.auto_dtype(self.store, self.plan.model)
            say(f"faster dtype here: {choice.dtype} ({choice.reason})")
            return choice.dtype
        return self.state.once("fast_dtype", measure)

    def mixed(self) -> bool:
        """Whether training jobs run in mixed precision: the plan's ``on``/``off``, or for ``auto`` where bfloat16
        is the faster dtype here (native bf16: AMX, AVX512-BF16; emulated bf16 would make the steps slower)."""
        if self.plan.mixed_precision == "auto":
            return self.fast_dtype() == "bfloat16"
        return self.plan.mixed_precision == "on"

    def ckpt(self, ckpt_id: str) -> Checkpoint:
        with self.store.session() as s:
            return repo.get_checkpoint(s, ckpt_id)

    def kept(self, ckpt_id: str, phases: str) -> Checkpoint:
        """The checkpoint a finished phase made (a warm start, a teacher) that a method starts or distils from;
        raises MissingCheckpoint, naming the phases to re-make, when its folder was deleted since (the state file
        still holds the phase as done, so nothing would make it again)."""
        ckpt = self.ckpt(ckpt_id)
        if not Path(ckpt.path).is_dir():
            raise MissingCheckpoint(
                f"checkpoint {ckpt.path}, made by the phases {phases} of {self.work / 'state.json'}, no longer "
                f"exists: the methods that start or distil from it cannot run. Restore the folder, or delete those "
                f"phases from the state file so that the next run makes it again from the same config (on the same "
                f"machine and thread count the same weights: a re-made teacher's stored check equals the old one), "
                f"or use a new --work folder")
        return ckpt

    def base(self) -> Checkpoint:
        return models.register(self.store, models.resolve(self.store, self.plan.model))

    def oracle_runs(self, domain: str) -> list[str]:
        """The oracle rollouts SFT trains on: one per training level (ladder) or one on SQuAD."""
        p = self.plan
        tasks = max(16, (max(p.teacher_steps) * p.warm_calls_per_step) // 3)
        out = []
        for level in (p.train_levels if domain == "ladder" else [0]):
            def make(level=level) -> str:
                if domain == "squad":
                    config = RolloutConfig(env="squad", data=p.squad, env_knobs={"docs": p.squad_docs},
                                           policy=PolicySource.oracle, episodes=tasks, seed=ORACLE_SEED,
                                           chunk_tokens=p.chunk_tokens, model=p.model,
                                           agent=p.agent(1.0, ORACLE_SEED, "squad"))
                else:
                    config = RolloutConfig(env="synthetic", env_knobs=self.ladder(level, "train"), model=p.model,
                                           policy=PolicySource.oracle, episodes=tasks, seed=ORACLE_SEED + level,
                                           chunk_tokens=p.chunk_tokens, agent=p.agent(1.0, ORACLE_SEED))
                result = run_rollout(self.store, config, self.runtime)
                say(f"oracle rollout {domain} level {level}: {result.run_id}, {len(result.episodes)} episodes")
                return result.run_id
            out.append(self.state.once(f"oracle/{domain}/{level}", make))
        return out

    def sft(self, name: str, runs: list[str], student: str, steps: int, lr: float, seed: int, calls: int,
            save_every: int | None = None, carry: bool = False, first_moment: bool = True,
            context: SamplingContext = SamplingContext.aligned) -> list[dict]:
        config = SftConfig(run_ids=runs, student=student, steps=steps, invocations_per_step=calls, carry_optimizer=carry,
                           carry_first_moment=first_moment, context=context, mixed_precision=self.mixed(),
                           keep_optimizer=True,  # the methods carry the warm start's AdamW state
                           lr=lr, warmup_steps=self.plan.warmup, schedule=LrSchedule.cosine, seed=seed,
                           out=str(self.work / "ckpt" / name), save_every=save_every)
        result = run_sft(self.store, config, self.runtime)
        with self.store.session() as s:
            return [ckpt_json(c) for c in repo.list_checkpoints(s, result.run_id)]

    def validation(self, domain: str) -> EvalConfig:
        """The episodes a teacher candidate of ``domain`` is validated on (training names, a seed of their own)."""
        p = self.plan
        if domain == "squad":
            return EvalConfig(env="squad", data=p.squad, env_knobs={"docs": p.squad_docs}, episodes=p.teacher_val,
                              seed=VALIDATION_SEED, chunk_tokens=p.chunk_tokens,
                              agent=p.agent(0.0, VALIDATION_SEED, "squad"))
        level = p.train_levels[len(p.train_levels) // 2]
        return EvalConfig(env="synthetic", env_knobs=self.ladder(level, "train"), episodes=p.teacher_val,
                          seed=VALIDATION_SEED + level, chunk_tokens=p.chunk_tokens,
                          agent=p.agent(0.0, VALIDATION_SEED))

    def teacher_first_reads(self, key: str, pick: dict) -> dict[str, float] | None:
        """``first_read_skips`` of a ladder teacher's picked candidate on its validation episodes (read back from
        the store: folders checked before the metric existed report it too); None for another domain."""
        if not key.startswith("ladder") or not pick.get("eval_run_id"):
            return None
        config = self.validation("ladder")
        tasks = {t.task_id: t for t in build_env(config, models.load_tokenizer(self.base().path)).tasks(config.episodes)}
        with self.store.session() as s:
            calls = repo.stream_invocations(s, run_ids=[pick["eval_run_id"]])
            task_of = {ep.id: tasks[ep.task_id] for ep in repo.list_episodes(s, pick["eval_run_id"])
                       if ep.task_id in tasks}
        return first_read_skips(calls, task_of)

    def teacher(self, key: str) -> str:
        """The validated teacher's checkpoint id: the best candidate whose empty rate is within bounds. ``key``
        is a domain (``ladder``, ``squad``), or ``ladder-privileged``: the teacher fine-tuned and validated under
        the privileged prompt (``teacher_key``)."""
        p = self.plan
        domain, _, privileged = key.partition("-")
        context = SamplingContext.privileged if privileged else SamplingContext.aligned

        def train() -> list[dict]:
            say(f"teacher ({key}): SFT on oracle calls ({context.value} prompt), candidates at steps {p.teacher_steps}")
            ckpts = self.sft(f"teacher-{key}", self.oracle_runs(domain), p.model, max(p.teacher_steps), p.warm_lr,
                             0, p.warm_calls_per_step, save_every=int(np.gcd.reduce(p.teacher_steps)), context=context)
            return [c for c in ckpts if c["step"] in p.teacher_steps]

        candidates = self.state.once(f"teacher/{key}/candidates", train)
        reports = []
        for c in candidates:
            def validate(c=c) -> dict:
                config = self.validation(domain).model_copy(update={"dtype": DType(self.eval_dtype()),
                                                                     "context": context})
                report = check_teacher(self.store, self.ckpt(c["id"]), config, self.runtime)
                say(f"teacher candidate step {c['step']}: {report.line()}")
                return {**asdict(report), "step": c["step"]}
            reports.append(self.state.once(f"teacher/{key}/check/{c['id']}", validate))
        def forgot(r: dict) -> float:
            return r.get("empty_after_evidence") or 0.0

        ok = [r for r in reports if max(r["empty_by_kind"].values(), default=0.0) <= p.max_teacher_empty
              and forgot(r) <= p.max_teacher_forgot]
        if not ok:
            worst = ", ".join(f"step {r['step']}: empty {max(r['empty_by_kind'].values(), default=0):.2f}, "
                              f"(empty) after evidence {forgot(r):.2f}" for r in reports)
            raise NoTeacher(f"no {key} teacher candidate has an empty-output rate within {p.max_teacher_empty} on "
                             f"every call kind and writes (empty) after evidence on at most {p.max_teacher_forgot} of "
                             f"its updates ({worst}): refusing to distil from a teacher that stops or drops evidence")
        # under the privileged prompt the answer call reads the gold answer, so F1 says little: that teacher is
        # picked by what it does at memory updates (the fewest `(empty)` after evidence), then by F1
        best = max(ok, key=lambda r: (-forgot(r), r["f1"], -r["step"]) if privileged else
                   (r["f1"], -forgot(r), -r["step"]))
        self.state.put(f"teacher/{key}/pick", best)
        for c in candidates:
            prune(c["path"], weights=c["id"] != best["teacher"])
        return best["teacher"]

    def warm(self, domain: str, seed: int) -> dict:
        p = self.plan
        return self.state.once(f"warm/{domain}/{seed}", lambda: self.sft(
            f"warm-{domain}-{seed}", self.oracle_runs(domain), p.model, p.warm_steps, p.warm_lr, seed,
            p.warm_calls_per_step)[-1])

    def rollout(self, policy: Checkpoint, config: RolloutConfig, key: str) -> str:
        def make() -> dict:
            backend = models.backend("transformers", policy.path, "float32", self.runtime)
            rolled = run_rollout(self.store, config.model_copy(update={"model": policy.path}), self.runtime,
                                 backend=backend, policy=policy)
            mean = float(np.mean([e.f1 or 0.0 for e in rolled.episodes]))
            say(f"rollout {rolled.run_id} of {policy.id[:8]} ({key}): F1 {mean:.3f}")
            return {"run": rolled.run_id, "f1": mean}
        return self.state.once(key, make)["run"]

    def psd_data(self, teacher: Checkpoint, config: RolloutConfig) -> str:
        key = f"data/psd_off/{config.env_knobs.get('level', config.env)}/{config.seed}"
        return self.rollout(teacher, config.model_copy(update={"context": SamplingContext.privileged}), key)

    def reopd_data(self, student: Checkpoint, oracle_run: str, seed: int) -> str:
        def make() -> dict:
            backend = models.backend("transformers", student.path, "float32", self.runtime)
            config = ReplayConfig(teacher_run=oracle_run, model=student.path, group_size=4, kappa=0.6, seed=seed,
                                  max_batch=32)
            replayed = run_replay(self.store, config, self.runtime, backend=backend, policy=student)
            return {"run": replayed.run_id, "f1": float("nan")}
        return self.state.once(f"data/reopd/{student.id}/{oracle_run}/{seed}", make)["run"]

    def momentum(self, seed: int) -> dict:
        """The null method: the warm start's AdamW state, carried as every method carries it, stepped for the
        methods' ``steps`` at their schedule with zero gradients (``coast``). Every method's update starts as
        this move; what a method adds is its difference from it. When nothing moves with zero gradients (no
        first moment carried: ``Plan.coasts``) it is the warm start's checkpoint itself, evaluated once."""
        p = self.plan
        warm_json = self.warm("ladder", seed)
        if not p.coasts:
            return warm_json
        warm = self.kept(warm_json["id"], f"warm/ladder/{seed}")
        model, tok = models.load(warm.path, "float32", self.runtime, trainable=True)
        params = [q for q in model.parameters() if q.requires_grad]
        optimizer = torch.optim.AdamW(params, lr=p.lr)
        if not carry_trainer_state(Path(warm.path), optimizer):
            raise RuntimeError(f"{warm.path} kept no optimizer state to coast on")
        coast(optimizer, [lr_at(step, p.lr, p.steps, p.warmup, LrSchedule.cosine) for step in range(p.steps)])
        folder = save_checkpoint(self.work / "ckpt" / f"momentum-{seed}" / f"step-{p.steps:06d}", model, tok,
                                 optimizer, p.steps)
        with self.store.session() as s:
            ckpt = repo.register_checkpoint(s, str(folder), warm.base_model)
            s.commit()
        return ckpt_json(ckpt)

    def sft_more(self, seed: int) -> list[dict]:
        warm = self.kept(self.warm("ladder", seed)["id"], f"warm/ladder/{seed}")
        return self.sft(f"sft_more-{seed}", self.oracle_runs("ladder"), warm.id, self.plan.steps, self.plan.lr,
                        seed, self.plan.calls_per_step, carry=self.plan.carry_warm_optimizer,
                        first_moment=self.plan.carry_warm_first_moment)[-1:]

    def on_policy(self, arm: str, seed: int) -> list[dict]:
        """Rounds of (rollout of the current student on fresh training tasks, ``steps_per_round`` distill
        steps), one schedule over every round, AdamW carried from round 2 on."""
        p = self.plan
        domain = "squad" if arm.startswith("squad") else "ladder"
        spec = dict(ON_POLICY[arm])
        kd, rl, seqkd = spec.pop("kd", False), spec.pop("rl", False), spec.pop("seqkd", False)
        key = teacher_key(p, arm)
        teacher = self.kept(self.teacher(key), f"teacher/{key}/*") if kd or seqkd else None
        policy = self.kept(self.warm(domain, seed)["id"], f"warm/{domain}/{seed}")
        oracles = self.oracle_runs(domain)
        out = []
        for r in range(p.rounds):
            level = p.train_levels[r % len(p.train_levels)]
            rollout_seed = 100 + 10 * seed + r
            config = self.training_rollout(domain, level, rollout_seed)
            if arm == "psd_off":
                runs = [self.psd_data(teacher, config)]
            elif arm == "reopd":
                runs = [self.reopd_data(policy, oracles[r % len(oracles)], rollout_seed)]
            elif seqkd and teacher is not None:  # the teacher's samples of the round's tasks (the same for every seed's round)
                runs = [self.rollout(teacher, config, f"data/seqkd/{teacher.id}/{rollout_seed}/{level}")]
            else:
                runs = [self.rollout(policy, config, f"rollout/{policy.id}/{rollout_seed}/{level}")]
            distill = DistillConfig(
                run_ids=runs, student=policy.id, teacher=teacher.id if teacher and kd else None,
                kd_weight=(p.rl_kd_weight if rl else 1.0) if kd else 0.0, ce_weight=1.0 if seqkd else 0.0,
                rl=RLKind.grpo if rl else RLKind.none, rl_weight=1.0 if rl else 0.0, steps=p.steps_per_round,
                invocations_per_step=p.calls_per_step, lr=p.lr, warmup_steps=p.warmup, schedule=LrSchedule.cosine,
                schedule_offset=r * p.steps_per_round, schedule_steps=p.steps,
                carry_optimizer=r > 0 or p.carry_warm_optimizer,
                carry_first_moment=r > 0 or p.carry_warm_first_moment,
                reward=RewardKind.max_f1_sub_em, monitor_start_kl=True, seed=seed,
                out=str(self.work / "ckpt" / f"{arm}-{seed}"), oversize=Oversize.skip,
                teacher_truncation=TeacherTruncation.left, loss=Divergence(p.loss),
                teacher_temperature=p.teacher_temperature,
                teacher_min_confidence=p.teacher_min_confidence if kd else 0.0, mixed_precision=self.mixed(),
                **spec)
            done = run_distill(self.store, distill, self.runtime)
            if r > 0:  # the previous round's checkpoint is no longer needed (a killed arm restarts from its warm start)
                prune(policy.path, weights=True)
            policy = done.last_checkpoint
            with self.store.session() as s:
                steps = repo.list_train_steps(s, done.run_id)
            for w in round_warnings(steps, rl):
                say(f"warning: {arm} seed {seed} round {r + 1}: {w}")
            say(f"{arm} seed {seed} round {r + 1}/{p.rounds}: {distill.steps} steps -> {policy.id[:8]}")
            out.append({**ckpt_json(policy), "round": r + 1, "distill_run": done.run_id})
        return out

    def train(self, arm: str, seed: int) -> dict:
        """The arm's final checkpoint (the warm start for ``warm``/``squad_warm``) and its distill runs."""
        def make() -> list[dict]:
            say(f"train {arm} seed {seed}")
            if arm == "warm":
                return [self.warm("ladder", seed)]
            if arm == "squad_warm":
                return [self.warm("squad", seed)]
            if arm == "teacher_ladder":  # the validated teacher itself: how far a student could follow it
                return [ckpt_json(self.kept(self.teacher("ladder"), "teacher/ladder/*"))]
            if arm == "momentum":
                return [self.momentum(seed)]
            if arm == "sft_more":
                return self.sft_more(seed)
            return self.on_policy(arm, seed)
        ckpts = self.state.once(f"arm/{arm}/{seed}", make)
        # the methods go on from the warm start's optimizer state (and a momentum arm that did not move is the warm start)
        warm_start = arm in ("warm", "squad_warm") or (arm == "momentum" and not self.plan.coasts)
        if not (warm_start and self.plan.carry_warm_optimizer):
            prune(ckpts[-1]["path"], weights=False)  # the optimizer state of a finished arm is never read again
        return {"final": ckpts[-1], "distill_runs": [c["distill_run"] for c in ckpts if "distill_run" in c]}

    def evaluate(self, arm: str, seed: int, ckpt: Checkpoint, ladder: bool, real: bool) -> dict:
        """Per component: F1 per question (sorted by task id, so arms pair up) and the greedy empty-output
        rate per call kind."""
        key = eval_key(arm, seed, ladder, real)
        if arm == "momentum" and not self.plan.coasts:  # the warm start's own checkpoint: its evaluation, read once
            def same() -> dict:
                warm = self.evaluate("warm", seed, ckpt, *arm_flags("warm"))
                names = {n for n, _ in self.heldout_sets(real) if ladder or not n.startswith("level")}
                return {part: {n: v for n, v in values.items() if n in names} for part, values in warm.items()}
            return self.state.once(key, same)

        def make() -> dict:
            say(f"evaluate {arm} seed {seed}")
            dtype = self.eval_dtype()
            backend = models.backend("transformers", ckpt.path, dtype, self.runtime)
            out: dict = {"scores": {}, "empty": {}, "length": {}, "forgot": {}, "runs": {}}
            for name, config in self.heldout_sets(real):
                if not ladder and name.startswith("level"):
                    continue
                row = run_eval(self.store, config.model_copy(update={"model": ckpt.path, "dtype": DType(dtype)}),
                               self.runtime, backend=backend, policy=ckpt)
                with self.store.session() as s:
                    episodes = sorted(repo.list_episodes(s, row.run_id), key=lambda e: (e.task_id, e.sample_index))
                out["scores"][name] = [float(e.f1 or 0.0) for e in episodes]
                out["empty"][name] = row.metrics.get("empty_by_kind", {})
                out["length"][name] = row.metrics.get("out_len_by_kind", {})
                out["forgot"][name] = row.metrics.get("empty_after_evidence")
                out["runs"][name] = row.run_id
            return out
        return self.state.once(key, make)

    def first_reads(self, evals: list[dict]) -> list[dict[str, float] | None]:
        """Per seed's evaluation: ``first_read_skips`` over its held-out ladder calls (every level together),
        read back from the store, so folders evaluated before the metric existed report it too."""
        if not self.heldout_tasks:
            tok = models.load_tokenizer(self.base().path)
            self.heldout_tasks.update({name: {t.task_id: t for t in build_env(c, tok).tasks(c.episodes)}
                                       for name, c in self.heldout_sets(False)})
        out = []
        for e in evals:
            calls, task_of = [], {}
            with self.store.session() as s:
                for name, run in e.get("runs", {}).items():
                    if name in self.heldout_tasks:
                        calls += repo.stream_invocations(s, run_ids=[run])
                        task_of |= {ep.id: self.heldout_tasks[name][ep.task_id] for ep in repo.list_episodes(s, run)
                                    if ep.task_id in self.heldout_tasks[name]}
            out.append(first_read_skips(calls, task_of))
        return out


def coast(optimizer: torch.optim.Optimizer, lrs: list[float]) -> None:
    """One ``optimizer`` step per learning rate in ``lrs`` with every gradient zero: what a carried Adam state
    alone moves the weights by (the first moment decays by beta1 a step and keeps pushing along the warm start's
    direction; the second moment sets the scale)."""
    params = [q for g in optimizer.param_groups for q in g["params"]]
    for lr in lrs:
        for g in optimizer.param_groups:
            g["lr"] = lr
        for q in params:
            q.grad = torch.zeros_like(q)
        optimizer.step()
    for q in params:
        q.grad = None


def prune(folder: str, weights: bool) -> None:
    """Free disk: a checkpoint's optimizer state (1 GB for the 135M model), and its weights too when asked."""
    path = Path(folder)
    (path / "trainer_state.pt").unlink(missing_ok=True)
    if weights:
        for f in path.glob("*.safetensors"):
            f.unlink()


def ckpt_json(c: Checkpoint) -> dict:
    return {"id": c.id, "step": c.step, "path": c.path}


# -- report ----------------------------------------------------------------------------------------------

def stack(evals: list[dict], components: list[str]) -> dict[str, np.ndarray]:
    """[seeds, questions] per component."""
    return {c: np.array([e["scores"][c] for e in evals]) for c in components}


def diff(a: dict, b: dict) -> tuple[float, float, float]:
    return cluster_bootstrap(a, b, n=2000)


def fmt(d: tuple[float, float, float]) -> str:
    return f"{d[0]:+.3f} [{d[1]:+.3f}, {d[2]:+.3f}]"


def step_metrics(store, runs: list[str]) -> list[dict]:
    """The metrics of every training step of the runs, in order (one read for the report's step statistics)."""
    with store.session() as s:
        return [st.metrics for rid in runs for st in repo.list_train_steps(s, rid)]


def live_fraction(steps: list[dict]) -> float | None:
    """Groups with a non-zero advantage over every step (None when no step had RL groups)."""
    groups = sum(m.get("rl_groups", 0.0) for m in steps)
    live = sum(m.get("rl_groups_live", 0.0) for m in steps)
    return live / groups if groups else None


def step_mean(steps: list[dict], key: str) -> float | None:
    """A step metric's mean over the steps that logged it (None when none did): ``kd_gated_fraction``, the
    teacher term's token weight left out by ``teacher_min_confidence``; ``kd_shared_fraction``, the share of
    the teacher's first-token push that ``teacher_centering`` removed."""
    shares = [m[key] for m in steps if key in m]
    return float(np.mean(shares)) if shares else None


def report(bench: Bench, results: dict) -> tuple[str, str]:
    """The tables (markdown, ``WORK/learning.md``) and the last line; the values behind them go to
    ``WORK/learning.json``: per arm (``arms``), per teacher (``teachers``), the paired ``differences``
    (mean, low, high), and how it ran (``mixed_precision``, ``momentum``: ``coast`` or ``warm_start``)."""
    p = bench.plan
    ladder = [f"level{lv}" for lv in p.heldout_levels]
    scores = {arm: stack(r["evals"], ladder) for arm, r in results.items() if r["ladder"]}
    base = scores["base"]
    lines = ["| arm | seeds | held-out F1, levels " + ",".join(map(str, p.heldout_levels)) + " [95%] | "
             + " | ".join(ladder) + " | vs warm (paired) | vs base (paired) | max empty rate | (empty) after "
             "evidence | RL live | teacher gated | push shared |",
             "|---|---:|---|" + "---:|" * len(ladder) + "---|---|---:|---:|---:|---:|---:|"]
    values: dict = {"arms": {}, "teachers": {}, "differences": {}, "mixed_precision": bench.mixed(),
                    "momentum": "coast" if p.coasts else "warm_start"}
    for arm in [a for a in ARMS if a in scores]:
        s = scores[arm]
        mean = cluster_bootstrap(s, n=2000)
        per = " | ".join(f"{s[c].mean():.3f}" for c in ladder)
        vs_warm = fmt(diff(s, scores["warm"])) if arm not in ("base", "warm") and "warm" in scores else ""
        vs_base = fmt(diff(s, base)) if arm != "base" else ""
        empty = max((v for e in results[arm]["evals"] for comp in e["empty"].values() for v in comp.values()), default=0)
        flag = " (collapsed)" if empty > 0.02 else ""
        forgot = [v for e in results[arm]["evals"] for v in e.get("forgot", {}).values() if v is not None]
        forgot_s = f"{max(forgot):.2f}" if forgot else ""
        live = results[arm].get("live")
        live_s = "" if live is None else (f"{live:.2f}" + (" (dead: no signal)" if live == 0 else ""))
        gated_s, shared_s = ("" if (v := results[arm].get(k)) is None else f"{v:.2f}" for k in ("gated", "shared"))
        values["arms"][arm] = {"seeds": len(results[arm]["evals"]), "f1": list(mean),
                               "levels": {c: float(s[c].mean()) for c in ladder}, "max_empty": empty,
                               "empty_after_evidence": max(forgot) if forgot else None, "rl_live": live,
                               "teacher_gated": results[arm].get("gated"), "push_shared": results[arm].get("shared")}
        lines.append(f"| {arm} | {len(results[arm]['evals'])} | {mean[0]:.3f} [{mean[1]:.3f}, {mean[2]:.3f}] | {per} | "
                     f"{vs_warm} | {vs_base} | {empty:.3f}{flag} | {forgot_s} | {live_s} | {gated_s} | {shared_s} |")
    table = "\n".join(lines)
    real = {arm: r for arm, r in results.items() if r["real"]}
    real_table = ""
    hotpot_d = (float("nan"),) * 3
    if real and p.hotpot:
        comps = ["hotpotqa", "ruler10"]
        rs = {arm: stack(r["evals"], comps) for arm, r in real.items()}
        rows = ["| arm | hotpotqa (gold paragraphs) | ruler_hotpotqa, 10 docs | both vs base (paired) |",
                "|---|---:|---:|---|"]
        for arm in [a for a in ARMS if a in rs]:
            d = fmt(diff(rs[arm], rs["base"])) if arm != "base" else ""
            rows.append(f"| {arm} | {rs[arm]['hotpotqa'].mean():.3f} | {rs[arm]['ruler10'].mean():.3f} | {d} |")
        real_table = "\n".join(rows)
        trained = "squad_opd" if "squad_opd" in rs else ("opd_aligned" if "opd_aligned" in rs else None)
        if trained:
            hotpot_d = diff(rs[trained], rs["base"])

    def d(a: str, b: str) -> tuple[float, float, float]:
        return diff(scores[a], scores[b]) if a in scores and b in scores else (float("nan"),) * 3

    lives = [results[a]["live"] for a in RL_ARMS if a in results and results[a].get("live") is not None]
    live = float(np.mean(lives)) if lives else float("nan")
    split = (f"aligned_minus_persistent_update={d('opd_aligned', 'opd_persistent_update')[0]:.3f} "
             f"aligned_minus_persistent_answer={d('opd_aligned', 'opd_persistent_answer')[0]:.3f}")
    last = (f"warm_minus_base={d('warm', 'base')[0]:.3f} aligned_minus_warm={d('opd_aligned', 'warm')[0]:.3f} "
            f"aligned_minus_persistent={d('opd_aligned', 'opd_persistent')[0]:.3f} "
            f"opd_rl_minus_rl={d('opd_grpo', 'grpo')[0]:.3f} rl_live_fraction={live:.2f} "
            f"hotpot_trained_minus_base={hotpot_d[0]:.3f} seeds={p.seeds}")
    differences = (
        ("warm_minus_base", d("warm", "base")), ("aligned_minus_warm", d("opd_aligned", "warm")),
        ("aligned_minus_persistent", d("opd_aligned", "opd_persistent")),
        ("aligned_minus_persistent_update (context on update calls only)", d("opd_aligned", "opd_persistent_update")),
        ("aligned_minus_persistent_answer (context on answer calls only)", d("opd_aligned", "opd_persistent_answer")),
        ("opd_rl_minus_rl", d("opd_grpo", "grpo")),
        ("rl_minus_momentum (the RL term against the warm start's momentum alone)", d("grpo", "momentum")),
        ("aligned_minus_momentum (the teacher term against the warm start's momentum alone)", d("opd_aligned", "momentum")),
        ("momentum_minus_warm (what the carried AdamW state alone does)", d("momentum", "warm")),
        ("privileged_rl_minus_rl (the privileged teacher's term beside the RL term, against the RL term alone)",
         d("opd_privileged_grpo", "grpo")),
        ("privileged_minus_warm (the privileged teacher's term alone)", d("opd_privileged", "warm")),
        ("centered_minus_warm (the teacher's push centred at first tokens)", d("opd_centered", "warm")),
        ("centered_minus_aligned (centring against the plain teacher term)", d("opd_centered", "opd_aligned")),
        ("centered_rl_minus_rl (the centred teacher term beside the RL term, against the RL term alone)",
         d("opd_grpo_centered", "grpo")),
        ("centered_memory_minus_warm (centred within calls of one kind and one memory state)",
         d("opd_centered_memory", "warm")),
        ("centered_memory_minus_aligned", d("opd_centered_memory", "opd_aligned")),
        ("centered_memory_rl_minus_rl (beside the RL term, against the RL term alone)",
         d("opd_grpo_centered_memory", "grpo")),
        ("privileged_centered_memory_minus_warm (the privileged teacher's term, centred by kind and memory state)",
         d("opd_privileged_centered_memory", "warm")),
        ("privileged_centered_memory_minus_centered_memory (the privileged teacher against the plain one, both "
         "centred)", d("opd_privileged_centered_memory", "opd_centered_memory")),
        ("privileged_centered_memory_rl_minus_rl (beside the RL term, against the RL term alone)",
         d("opd_privileged_grpo_centered_memory", "grpo")),
        ("hotpot_trained_minus_base", hotpot_d),
        ("aligned_minus_sft_more (on-policy distillation against SFT continued on oracle calls)",
         d("opd_aligned", "sft_more")),
        ("aligned_minus_seqkd (on-policy against off-policy distillation from the same teacher)",
         d("opd_aligned", "seqkd")))
    values["differences"] = {name.split()[0]: [float(x) for x in v] for name, v in differences}
    intervals = "\n".join(f"- `{name}`: {fmt(v)}" for name, v in differences)
    picks = [(key, pick) for key in teacher_keys(p) if (pick := bench.state.get(f"teacher/{key}/pick"))]
    def skips(d: dict[str, float] | None) -> str:
        return "" if d is None else f"{d.get('evidence', float('nan')):.2f} / {d.get('other', float('nan')):.2f}"

    for key, pick in picks:
        values["teachers"][key] = {"step": pick["step"], "f1": pick["f1"],
                                   "first_reads": bench.teacher_first_reads(key, pick)}
    teachers = "\n".join(
        ["| teacher | prompt | picked at SFT step | validation F1 | (empty) after evidence | max empty rate | "
         "first reads, evidence / other |", "|---|---|---:|---:|---:|---:|---:|"]
        + [f"| {key} | {'privileged' if key.endswith('-privileged') else 'plain'} | {pick['step']} | {pick['f1']:.3f} | "
           f"{pick.get('empty_after_evidence') or 0:.2f} | {max(pick['empty_by_kind'].values(), default=0):.3f} | "
           f"{skips(values['teachers'][key]['first_reads'])} |" for key, pick in picks])

    reads = ["| arm | " + " | ".join(f"seed {i}" for i in range(p.seeds)) + " |", "|---|" + "---:|" * p.seeds]
    for arm in [a for a in ARMS if a in scores]:
        values["arms"][arm]["first_reads"] = bench.first_reads(results[arm]["evals"])
        cells = [skips(d) for d in values["arms"][arm]["first_reads"]]
        reads.append(f"| {arm} | " + " | ".join(cells + [""] * (p.seeds - len(cells))) + " |")
    reads_table = "\n".join(reads)
    text = (f"## Held-out ladder\n\n{table}\n\n{p.heldout_per_level} questions per level, {p.seeds} training seed(s); "
            "intervals resample questions and seeds. Max empty rate: the largest greedy end-of-sequence-only share of "
            "any call kind over the arm's evaluations (above 0.02: collapsed). (empty) after evidence: the largest share, "
            "over the ladder levels, of update calls made once a fact was read whose memory is `(empty)` or blank (a "
            "student that learned to write `(empty)` whatever it read; `agentmem eval`'s `empty_after_evidence`). RL live: share of GRPO groups with a "
            "non-zero advantage over every step. Teacher gated: the share of the teacher term's token weight that "
            "`teacher_min_confidence` left out, mean over the steps. Push shared: the share of the teacher term's push at "
            "first tokens that `teacher_centering` removed (its mean over each call kind's calls), mean over the steps. "
            "Training ran in "
            + ("mixed precision (decoders in bf16 autocast, float32 weights and optimiser)" if bench.mixed()
               else "float32")
            + f", the evaluations in {bench.eval_dtype()} (`auto` takes bfloat16 where this CPU has it natively; a "
            "table made in one dtype is reproduced in that dtype, since round-off flips a few greedy answers). "
            + ("Momentum: the warm start's carried AdamW stepped with zero gradients (the move every method makes "
               "before its own gradient counts)." if p.coasts else
               "Momentum is the warm start itself: no first moment is carried, so the carried state moves nothing "
               "with zero gradients and every method's move is its own gradients'.")
            + "\n\n## First reads (does a student tell evidence "
            f"from a distractor?)\n\n{reads_table}\n\nOf the held-out update calls (levels together) that read a "
            "chunk while holding nothing, the share that write an empty memory: evidence reads (a fact of the task is in "
            "the chunk) / other reads (`agentmem eval`'s `empty_at_first_read`). Both low: writes whatever it reads; both "
            f"high: skips whatever it reads; only a gap between them is a decision.\n\n## Teachers\n\n{teachers}\n\nValidation on "
            f"{p.teacher_val} training-name episodes, under the prompt each teacher reads (a privileged teacher's F1 is "
            "high by construction: its answer call reads the gold answer). First reads: as in the table above, on those "
            "validation episodes; the decision a teacher term could teach.\n\n"
            f"## Real text\n\n{real_table or '(no ../shared data)'}\n\n"
            f"## Differences (paired, 95%)\n\n{intervals}\n\n{split}\n")
    (bench.work / "learning.md").write_text(text)
    (bench.work / "learning.json").write_text(json.dumps(values, indent=1, default=float))
    return text, last


def plot_dynamics(bench: Bench, results: dict, path: Path) -> None:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(13, 8))
    FigureCanvasAgg(fig)
    panels = [("rl_live_fraction", "share of GRPO groups with a non-zero advantage"),
              ("eos_first/", "first-token EOS mass (mean over call kinds)"),
              ("out_len/", "mean output length, tokens (mean over kinds)"),
              ("kl_teacher", "KL(student || teacher)"), ("kl_start", "KL(student || round start)")]
    axes = [fig.add_subplot(2, 3, i + 1) for i in range(len(panels))]
    with bench.store.session() as s:
        for arm, r in results.items():
            runs = r.get("distill_runs_seed0") or []
            steps = [st for rid in runs for st in repo.list_train_steps(s, rid)]
            if not steps:
                continue
            for ax, (key, title) in zip(axes, panels, strict=True):
                ys = []
                for st in steps:
                    vals = [v for k, v in st.metrics.items() if (k.startswith(key) if key.endswith("/") else k == key)]
                    ys.append(float(np.mean(vals)) if vals else np.nan)
                if not all(np.isnan(ys)):
                    ax.plot(range(1, len(ys) + 1), ys, marker="o", label=arm)
                ax.set_title(title, fontsize=9)
                ax.set_xlabel("step (after the warm start)", fontsize=8)
    labelled = max(axes, key=lambda ax: len(ax.get_lines()))  # the RL panel has lines only when an RL arm ran
    if labelled.get_lines():
        labelled.legend(fontsize=7)
    fig.suptitle("Training dynamics, seed 0")
    fig.savefig(path, dpi=110, bbox_inches="tight")


# -- main ------------------------------------------------------------------------------------------------


def quiet_transformers() -> None:
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()


def open_bench(work: Path, plan: Plan, threads: int) -> Bench:
    # a later run may add arms, or training seeds, to the same folder: every phase of seed s is named by s and
    # made from seed s's own data (rollouts 100 + 10 s + round), so more seeds leave the earlier ones' phases valid
    state = State(work / "state.json", plan, free=("arms", "seeds"))
    runtime = Runtime.create("cpu", threads)
    store = open_store(f"sqlite:///{work / 'learning.db'}", create=True)
    return Bench(store, runtime, plan, work, state)


def teacher_key(plan: Plan, arm: str) -> str:
    """The teacher an arm distils from: its domain's (``ladder``, ``squad``), or ``ladder-privileged`` for the
    arms whose teacher reads the privileged prompt when ``plan.privileged_teacher_sft``."""
    domain = "squad" if arm.startswith("squad") else "ladder"
    privileged = ON_POLICY.get(arm, {}).get("context") is TeacherContext.privileged
    return f"{domain}-privileged" if privileged and plan.privileged_teacher_sft else domain


def uses_teacher(arm: str) -> bool:
    """Whether an arm reads a teacher: its term (``kd``) or its samples (``seqkd``)."""
    spec = ON_POLICY.get(arm, {})
    return bool(spec.get("kd") or spec.get("seqkd"))


def teacher_keys(plan: Plan) -> list[str]:
    """Every teacher the plan's arms distil from (or evaluate: ``teacher_ladder``), in a stable order."""
    keys = {teacher_key(plan, a) for a in plan.arms if uses_teacher(a)}
    keys |= {"ladder"} if "teacher_ladder" in plan.arms else set()
    return sorted(keys)


def arm_seeds(plan: Plan, arm: str) -> range:
    """The training seeds of an arm: one for a model that is not trained per seed (base, the teacher)."""
    return range(1) if arm in ("base", "teacher_ladder") else range(plan.seeds)


def eval_key(arm: str, seed: str | int, ladder: bool, real: bool) -> str:
    """The state phase of an arm-seed's evaluation on the ladder and/or real text (``Bench.evaluate``)."""
    return f"eval/{arm}/{seed}/{int(ladder)}{int(real)}"


def arm_flags(arm: str) -> tuple[bool, bool]:
    """(evaluated on the ladder, evaluated on real text)"""
    return not arm.startswith("squad"), arm in REAL_ARMS


def job(work: str, plan: dict, threads: int, task: tuple[str, str | int]) -> str:
    """One unit of ``--jobs`` work in its own process (phases go to the shared state file): ``("teacher",
    domain)``, ``("base", 0)`` (the base model's evaluation) or ``(arm, seed)`` (train, then evaluate)."""
    quiet_transformers()
    bench = open_bench(Path(work), Plan(**plan), threads)
    kind, arg = task
    if kind == "teacher":
        try:
            bench.teacher(str(arg))
        except NoTeacher as e:  # the main process meets it again from the stored checks and refuses the arms
            return f"{arg} teacher: {e}"
    elif kind == "base":
        bench.evaluate("base", 0, bench.base(), True, True)
    else:
        seed = int(arg)
        trained = bench.train(kind, seed)
        bench.evaluate(kind, seed, bench.ckpt(trained["final"]["id"]), *arm_flags(kind))
    return f"{kind} {arg} done"


def refused_arms(bench: Bench) -> dict[str, str]:
    """Arm -> why it may not run: the distilling arms whose teacher failed its check (the teacher is
    validated here, before any arm distils from it; the other arms still run)."""
    refused: dict[str, str] = {}
    for key in teacher_keys(bench.plan):
        try:
            bench.teacher(key)
        except NoTeacher as e:
            say(f"warning: {e}")
            refused |= {a: str(e) for a in bench.plan.arms
                        if (ON_POLICY.get(a, {}).get("kd") and teacher_key(bench.plan, a) == key)
                        or a == f"teacher_{key}"}
    return refused


def done(bench: Bench, kind: str, arg: str | int) -> bool:
    """Whether a ``job`` task's phases are all in the state file."""
    state = bench.state
    if kind == "teacher":
        return state.get(f"teacher/{arg}/pick") is not None or (
            (cands := state.get(f"teacher/{arg}/candidates")) is not None
            and all(state.get(f"teacher/{arg}/check/{c['id']}") is not None for c in cands))
    ladder, real = arm_flags(kind)
    trained = kind == "base" or state.get(f"arm/{kind}/{arg}") is not None
    return trained and state.get(eval_key(kind, arg, ladder, real)) is not None


def die_with_parent() -> None:
    """A ``--jobs`` worker ends when the benchmark's process does (Linux ``PR_SET_PDEATHSIG``), so a killed
    run leaves no worker training on; elsewhere a no-op. Its finished phases are in the state file."""
    import ctypes
    import signal

    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, int(signal.SIGKILL))  # 1: PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def needs(bench: Bench, task: tuple[str, str | int]) -> dict[str, tuple[str, str | int]]:
    """The state phases ``task`` reads before it can start, each with the task that makes it."""
    kind, arg = task
    if kind in ("base", "teacher", "warm", "squad_warm"):
        return {}
    if kind == "teacher_ladder":
        return {"teacher/ladder/pick": ("teacher", "ladder")}
    domain = "squad" if kind.startswith("squad") else "ladder"
    out: dict[str, tuple[str, str | int]] = {f"warm/{domain}/{arg}": ("squad_warm" if domain == "squad" else "warm", arg)}
    if uses_teacher(kind):
        key = teacher_key(bench.plan, kind)
        out[f"teacher/{key}/pick"] = ("teacher", key)
    if kind == "momentum" and not bench.plan.coasts:  # it reads the warm start's evaluation (Bench.evaluate)
        out[eval_key("warm", arg, *arm_flags("warm"))] = ("warm", arg)
    return out


def task_order(plan: Plan) -> list[tuple[str, str | int]]:
    """The tasks of ``run_jobs``, in the order a free process takes them (the first whose needs are there): the
    warm starts and the teachers first, since every method waits for them, then the arms in ``RUN_ORDER``, with
    the base model's evaluation after the ladder arms of the last line (``BASE_AFTER``). Nothing waits for it but
    the report, and it is the longest evaluation (base runs every call to its token cap, on real text too): first,
    it kept a process from the critical path (the quick run's methods started 13.5 min in, behind it and the SQuAD
    teacher); last, it ran alone at the end (a float32 quick run: 9.4 of its 11.7 min, one process idle).
    Mid-list, a list-scheduling simulation on that run's task times ends 3-4% sooner (99.6 against 103.9 min;
    on a bf16 CPU's times: 29.7-29.9 against 31.4)."""
    arms = [(a, seed) for a in RUN_ORDER if a in plan.arms for seed in arm_seeds(plan, a)]
    warm = [t for t in arms if t[0] == "warm"]
    rest = [t for t in arms if t not in warm]
    cut = max((i + 1 for i, t in enumerate(rest) if t[0] in BASE_AFTER), default=len(rest))
    return [*warm, *[("teacher", k) for k in teacher_keys(plan)], *rest[:cut], ("base", 0), *rest[cut:]]


def run_jobs(bench: Bench, tasks: list[tuple[str, str | int]], jobs: int, threads: int) -> None:
    """Run ``tasks`` in ``jobs`` processes of ``threads`` threads each. A task starts as soon as a process is
    free and the phases it needs (``needs``) are in the state file, the first such in list order (an arm
    starts once its warm start's checkpoint is saved, while that warm start is still being evaluated); a
    phase whose maker is not in the list is made by the task itself. A task whose teacher was refused is
    dropped (the report names it). Every finished phase is in the state file, so a killed run goes on where
    it stopped. Raises the first failure after every running task has ended."""
    import multiprocessing as mp
    from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait

    queue = list(tasks)
    if not queue:
        return
    say(f"{len(queue)} tasks in {jobs} processes of {threads} thread(s): {', '.join(f'{a}/{b}' for a, b in queue)}")
    running: dict = {}
    finished: set[tuple[str, str | int]] = set()
    errors: list[Exception] = []
    with ProcessPoolExecutor(max_workers=jobs, mp_context=mp.get_context("spawn"),
                             initializer=die_with_parent) as pool:
        while queue or running:
            bench.state.refresh()
            waiting = set(queue) | set(running.values())
            for t in list(queue):
                if len(running) >= jobs or errors:
                    break
                blocked = False
                for phase, maker in needs(bench, t).items():
                    if bench.state.get(phase) is not None:
                        continue
                    if maker in finished and maker[0] == "teacher":  # checked, and refused: no pick
                        queue.remove(t)
                        blocked = True
                        break
                    if maker in waiting:
                        blocked = True
                        break
                if not blocked and t in queue:
                    queue.remove(t)
                    running[pool.submit(job, str(bench.work), asdict(bench.plan), threads, t)] = t
            if errors and not running:
                break
            if not running:
                if queue:  # nothing can start and nothing runs: a dependency cycle cannot happen; guard anyway
                    raise RuntimeError(f"tasks cannot start: {queue}")
                break
            done_now, _ = wait(list(running), timeout=15, return_when=FIRST_COMPLETED)
            for f in done_now:
                t = running.pop(f)
                finished.add(t)
                try:
                    say(f.result())
                except Exception as e:  # noqa: BLE001 - reported, then raised once the running ones end
                    say(f"error: {t[0]} {t[1]}: {type(e).__name__}: {e}")
                    errors.append(e)
    bench.state.refresh()
    if errors:
        raise errors[0]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true",
                    help="one seed, a short budget, fewer held-out questions, the paper's comparisons (QUICK_ARMS)")
    ap.add_argument("--smoke", action="store_true", help="every phase on a tiny random model, in a minute or two")
    ap.add_argument("--work", type=Path, default=Path("learning-bench"), help="folder for the store and outputs")
    ap.add_argument("--threads", type=int, default=2, help="torch threads in all (split between --jobs)")
    ap.add_argument("--jobs", type=int, default=1,
                    help="processes that train and evaluate arm-seeds side by side (each gets threads/jobs "
                         "threads); 2 on 2 cores: small-batch steps use a second core poorly, a second arm well")
    ap.add_argument("--seeds", type=int, help="training seeds (default: 3, or 1 with --quick)")
    ap.add_argument("--steps", type=int, help="method steps after the warm start")
    ap.add_argument("--arms", help="comma-separated subset (base, warm and momentum, the yardsticks, always run): "
                    + ", ".join(ARMS))
    ap.add_argument("--lr", type=float, help="peak learning rate of every arm after the warm start (default 2e-5)")
    ap.add_argument("--warm-steps", type=int, help="SFT steps of the warm start (default 16)")
    ap.add_argument("--warm-lr", type=float, help="peak learning rate of the warm start and the teacher (default 5e-5)")
    ap.add_argument("--loss", choices=[d.value for d in Divergence],
                    help="divergence of the teacher term (default forward_kl; reverse_kl is MemOPD's)")
    ap.add_argument("--carry-warm-optimizer", action=argparse.BooleanOptionalAction, default=None,
                    help="every method goes on with the warm start's AdamW state (default on); --no-carry-warm-optimizer "
                         "starts each with a fresh AdamW, whose first step moves every weight by about the lr")
    ap.add_argument("--carry-warm-first-moment", action=argparse.BooleanOptionalAction, default=None,
                    help="with the warm start's AdamW state carried, carry its first moment too (default on); "
                         "--no-carry-warm-first-moment starts it at zero and keeps the second moment and step count, "
                         "so a method's update is its own gradients' and the momentum arm does not move")
    ap.add_argument("--mixed-precision", choices=["off", "on", "auto"],
                    help="every training job (warm start, teachers, methods) runs its decoders under bfloat16 autocast, "
                         "with float32 weights, optimiser state and output head: a 1.6x (this bench's step) to 2x faster "
                         "step on CPUs with AMX or AVX512-BF16, slower where bf16 is emulated (AVX2); results differ "
                         "from float32's "
                         "by its rounding. auto: on where bfloat16 measures faster here (default off, or auto with "
                         "--quick)")
    ap.add_argument("--teacher-temperature", type=float,
                    help="divide the teacher's log-probs by this before the divergence (default 1; below 1 the "
                         "target leans to the teacher's greedy choice)")
    ap.add_argument("--teacher-min-confidence", type=float,
                    help="distil only at positions where the teacher's top probability is at least this (default "
                         "0: everywhere); the RL term still applies at the others")
    ap.add_argument("--rl-kd-weight", type=float,
                    help="the teacher term's weight in arms that also have the RL term, opd_grpo and opd_privileged_grpo "
                         "(default 1; the RL term keeps 1): below 1 the reward leads and the teacher follows")
    ap.add_argument("--privileged-teacher-sft", action=argparse.BooleanOptionalAction, default=None,
                    help="the privileged arms' teacher (opd_privileged, opd_privileged_grpo, psd_off): fine-tuned on the oracle calls under "
                         "the privileged prompt it reads and picked on validation under it (default: no, the ladder "
                         "teacher, fine-tuned on the plain prompt, reads the splice)")
    ap.add_argument("--teacher-steps", help="comma-separated SFT steps of the teacher candidates (default 32,64,96, "
                    "or 16,24,32 with --quick)")
    ap.add_argument("--group", type=int,
                    help="samples per training task in each on-policy rollout (default 8): the GRPO group, so more "
                         "samples give more groups with a non-zero advantage when most tasks score 0")
    ap.add_argument("--teacher-val", type=int,
                    help="validation episodes per teacher candidate (default 32, or 8 with --quick): the pick is by "
                         "their F1, so few episodes tie candidates of different strength")
    ap.add_argument("--calls-per-step", type=int,
                    help="stored calls per optimiser step of every method after the warm start (default 24, 8 with "
                         "--quick; the "
                         "warm start and the teacher keep 8): more calls give a less noisy step at the same rate, "
                         "and an on-policy round uses more of its rollout")
    ap.add_argument("--heldout-per-level", type=int, help="held-out questions per ladder level")
    ap.add_argument("--heldout-real", type=int, help="questions per real-text held-out set")
    ap.add_argument("--eval-dtype", choices=["auto", "float32", "bfloat16"],
                    help="dtype of the greedy evaluations and teacher checks (default auto: the faster one here)")
    ap.add_argument("--report-partial", action="store_true",
                    help="report the arms whose every seed has finished in WORK and train nothing more (the "
                         "base model's evaluation and the teachers must be done); say which arms are missing")
    ap.add_argument("--model", default=None, help="the base model (default: the default model)")
    ap.add_argument("--hotpot", help="HotpotQA file for the real-text sets (default: the shared one if present)")
    ap.add_argument("--squad", help="SQuAD v1.1 file for the real-text arm (default: the shared one if present)")
    args = ap.parse_args()
    work = args.work.resolve()
    work.mkdir(parents=True, exist_ok=True)
    model = args.model or (tiny_model(work, "tiny-model") if args.smoke else "default")
    plan = make_plan(args, model)
    if args.jobs < 1:
        raise SystemExit(f"--jobs must be >= 1, got {args.jobs}")
    quiet_transformers()
    threads = 1 if args.smoke else args.threads
    bench = open_bench(work, plan, threads)
    store = bench.store
    t0 = time.perf_counter()
    say(f"plan: {json.dumps(asdict(plan))}")
    if args.jobs > 1 and not args.report_partial:
        # the phases every arm shares come first, in this process (oracle rollouts, the evaluation dtype),
        # then every task side by side, each as soon as what it needs is there (arms in the order above:
        # the warm starts before the arms that start from them)
        per_job = max(1, threads // args.jobs)
        for d in {"squad" if a.startswith("squad") else "ladder" for a in plan.arms if a != "base"}:
            bench.oracle_runs(d)
        bench.eval_dtype()
        say(f"training in {'mixed precision (bf16 autocast, float32 weights)' if bench.mixed() else 'float32'}")
        run_jobs(bench, [t for t in task_order(plan) if not done(bench, *t)], args.jobs, per_job)
    results: dict = {}
    base = bench.base()
    results["base"] = {"evals": [bench.evaluate("base", 0, base, True, True)], "ladder": True, "real": True}
    refused = refused_arms(bench)
    missing = []
    for arm in [a for a in plan.arms if a != "base" and a not in refused]:
        evals, runs = [], []
        ladder, real = arm_flags(arm)
        if args.report_partial and not all(done(bench, arm, seed) for seed in arm_seeds(plan, arm)):
            missing.append(arm)
            continue
        for seed in arm_seeds(plan, arm):
            trained = bench.train(arm, seed)
            evals.append(bench.evaluate(arm, seed, bench.ckpt(trained["final"]["id"]), ladder, real))
            runs.append(trained["distill_runs"])
        steps = step_metrics(store, [r for rs in runs for r in rs])
        results[arm] = {"evals": evals, "ladder": ladder, "real": real, "distill_runs_seed0": runs[0],
                        "live": live_fraction(steps) if arm in RL_ARMS else None, "gated": step_mean(steps, "kd_gated_fraction"),
                        "shared": step_mean(steps, "kd_shared_fraction")}
        empty = max((v for e in evals for c in e["empty"].values() for v in c.values()), default=0.0)
        if empty > EMPTY_WARN:
            say(f"warning: {arm} writes end-of-sequence-only outputs on {empty:.0%} of some call kind (collapsed)")
    text, last = report(bench, results)
    if refused:
        text += "\n**Refused arms** (no teacher passed the check; nothing was distilled from a bad one):\n\n" + "".join(
            f"- `{a}`: {why}\n" for a, why in refused.items())
        (work / "learning.md").write_text(text)
    if missing:
        text += (f"\n**Partial report** (`--report-partial`): the arms {', '.join(missing)} have not finished every "
                 f"seed in {work} and are left out; run the same command without the flag to finish them.\n")
        (work / "learning.md").write_text(text)
    plot_dynamics(bench, results, work / "dynamics.png")
    print(text)
    say(f"done in {(time.perf_counter() - t0) / 60:.1f} min; outputs in {work}")
    print(last)


if __name__ == "__main__":
    main()
