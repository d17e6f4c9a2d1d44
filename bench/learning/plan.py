"""The plan: every knob of one benchmark run, the arms and the order their tasks run in."""

from __future__ import annotations

import argparse
from dataclasses import asdict, dataclass, field
from pathlib import Path

from agentmem.config import (
    AgentConfig,
    KdForm,
    PsdMode,
    TeacherCentering,
)
from agentmem.records import TeacherContext

ROOT = Path(__file__).resolve().parents[2]

# in the order they run (the paper's questions first, so a partial run answers them)
LADDER_ARMS = ("opd_aligned", "grpo", "opd_grpo", "sft_more", "seqkd", "opd_persistent", "opd_persistent_update",
               "opd_persistent_answer", "opd_persistent_chat", "opd_privileged", "opd_privileged_grpo", "psd_off", "reopd",
               "opd_centered", "opd_grpo_centered", "opd_centered_memory", "opd_grpo_centered_memory",
               "opd_privileged_centered_memory", "opd_privileged_grpo_centered_memory")
# the teachers with headroom and their controls (``teacher`` in ON_POLICY: t0, the warm start itself; rl, the warm
# start after a long RL run; hint, SFT under the hint prompt; none, the SFT teacher of the arms above)
TEACHER_ARMS = ("opd_t0", "opd_rl", "opd_hint", "seqkd_rl", "seqkd_hint", "opd_grpo_hint", "grpo_long")
ARMS = ("base", "warm", "momentum", "teacher_ladder", "teacher_rl", "teacher_hint", *LADDER_ARMS, *TEACHER_ARMS,
        "squad_warm", "squad_opd")
ALWAYS = ("base", "warm", "momentum")  # the yardsticks: every run has them, whatever --arms says
# the base model's evaluation starts after these (task_order): the ladder arms of the last line
BASE_AFTER = ("opd_aligned", "grpo", "opd_grpo", "opd_persistent")
# --quick's arms: the last line's comparisons (each teacher's OPD, SFT continued, off-policy distillation from
# T_rl, the RL term with and without T_hint, the persistent context) and the teachers themselves; the other
# ablations run in the full plan or with --arms, so that --quick does not grow with every ablation
QUICK_ARMS = ("base", "warm", "momentum", "teacher_ladder", "teacher_rl", "teacher_hint", "opd_t0", "opd_aligned",
              "opd_rl", "opd_hint", "sft_more", "seqkd_rl", "grpo", "opd_grpo_hint", "opd_persistent")
# --pilot's arms (one seed, evaluated at PILOT_STEPS along one run each): the gap recovery of T_rl and T_hint
PILOT_ARMS = ("base", "warm", "momentum", "teacher_rl", "teacher_hint", "opd_rl", "opd_hint", "sft_more", "grpo")
# the order --jobs starts them in: the last line's arms first (a partial run answers the benchmark's goals),
# then the other comparisons
RUN_ORDER = ("warm", "momentum", "teacher_ladder", "teacher_rl", "teacher_hint", "opd_rl", "opd_hint", "opd_t0",
             "opd_aligned", "grpo", "opd_grpo_hint", "sft_more", "seqkd_rl", "seqkd_hint", "grpo_long", "opd_grpo",
             "opd_persistent", "squad_warm", "squad_opd",
             "seqkd", "opd_persistent_update", "opd_persistent_answer", "opd_persistent_chat", "opd_privileged",
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
    "opd_t0": {"kd": True, "teacher": "t0"},
    "opd_rl": {"kd": True, "teacher": "rl"},
    "opd_hint": {"kd": True, "teacher": "hint", "context": TeacherContext.hint},
    "seqkd_rl": {"seqkd": True, "teacher": "rl"},
    "seqkd_hint": {"seqkd": True, "teacher": "hint"},  # the hint teacher's samples under its own prompt
    # the RL-plus-distillation form: the teacher in the advantage, c picked on validation (Plan.teacher_coefs)
    "opd_grpo_hint": {"kd": True, "rl": True, "teacher": "hint", "context": TeacherContext.hint,
                      "kd_form": KdForm.advantage},
    "grpo_long": {"rl": True},  # the student's budget plus T_rl's RL steps: T_rl's arms at equal compute
}
RL_ARMS = ("grpo", "opd_grpo", "opd_privileged_grpo", "opd_grpo_centered", "opd_grpo_centered_memory",
           "opd_privileged_grpo_centered_memory", "opd_grpo_hint", "grpo_long")
# evaluated on real text too (and each teacher's best arm, once the ladder has picked it: Bench.real_text)
REAL_ARMS = ("base", "warm", "sft_more", "opd_aligned", "squad_warm", "squad_opd")
ONCE = ("base", "teacher_ladder", "teacher_hint")  # models no training seed changes: evaluated once
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
    # what the greedy evaluation measures; DistillConfig.teacher.temperature)
    teacher_temperature: float = 1.0
    # positions where the teacher's top probability is below this get no teacher term (the RL term still
    # applies): the teacher is left out where it is split (DistillConfig.teacher.min_confidence)
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
    # the question forms of every ladder task (envs/synthetic.py): mixed draws entity, yes/no and number questions
    forms: str = "mixed"
    # T_rl: the warm start of each seed, then the RL term alone for rl_teacher_steps (about 10x the method budget),
    # candidates at rl_teacher_candidates picked on validation (rollout seeds of their own: rollout_seed)
    rl_teacher_steps: int = 80
    rl_teacher_candidates: list[int] = field(default_factory=lambda: [40, 80])
    # opd_grpo_hint's coefficient c of the teacher in the advantage, picked on validation among these
    teacher_coefs: list[float] = field(default_factory=lambda: [0.1, 0.3, 1.0])
    # the gate of T_rl and T_hint (teachers.GateLimits; None: that check is off, as in --smoke)
    gate_f1_margin: float | None = 0.10
    gate_min_gap: float | None = 0.5
    gate_max_empty: float = 0.02
    gate_max_eos_first: float = 0.05
    # the persistent arms' teacher (the MemOPD comparison): sft or rl (the hint is a context of its own)
    persistent_teacher: str = "rl"
    # --pilot: the steps at which each arm's checkpoints are evaluated along its one run (empty: no pilot)
    pilot_steps: list[int] = field(default_factory=list)
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
                    max_teacher_empty=1.0, max_teacher_forgot=1.0, eval_dtype="float32", rl_teacher_steps=2,
                    rl_teacher_candidates=[1, 2], teacher_coefs=[0.3, 1.0], gate_f1_margin=None, gate_min_gap=None,
                    gate_max_empty=1.0, gate_max_eos_first=1.0, **common)
    elif args.quick:
        # one c for opd_grpo_hint (a pick among three would add three trainings): the plan fits 30 min on 2 cores
        plan = Plan(seeds=1, warm_steps=16, steps=4, steps_per_round=2, calls_per_step=8, rollout_tasks=4, group=8,
                    heldout_per_level=12, heldout_real=12, teacher_steps=[16, 24, 32], teacher_val=8,
                    rl_teacher_steps=40, rl_teacher_candidates=[20, 40], teacher_coefs=[0.3],
                    mixed_precision="auto", arms=[a for a in ARMS if a in QUICK_ARMS], **common)
    elif getattr(args, "pilot", False):
        # the gap-recovery pilot: one seed, T_rl and T_hint, each arm one 64-step run evaluated at 8, 24 and 64
        plan = Plan(seeds=1, warm_steps=16, steps=64, steps_per_round=2, calls_per_step=24, rollout_tasks=4, group=8,
                    heldout_per_level=32, heldout_real=40, teacher_steps=[32, 64, 96], teacher_val=32,
                    pilot_steps=[8, 24, 64], arms=list(PILOT_ARMS), **common)
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
    if plan.rounds > 1000:  # rollout_seed: 1000 rounds per seed
        raise SystemExit(f"--steps: at most 1000 rounds of {plan.steps_per_round} steps (the seeds' rollout tasks are "
                         f"1000 apart), got {plan.steps} steps ({plan.rounds} rounds)")
    if not plan.squad:
        plan = Plan(**{**asdict(plan), "arms": [a for a in plan.arms if not a.startswith("squad")]})
    return plan


def teacher_key(plan: Plan, arm: str, seed: int = 0) -> str:
    """The teacher an arm distils from: its domain's SFT teacher (``ladder``, ``squad``), ``ladder-privileged``
    for the arms whose teacher reads the privileged prompt when ``plan.privileged_teacher_sft``, ``ladder-hint``
    (T_hint), or per training seed ``rl-SEED`` (T_rl) and ``t0-SEED`` (T0, the warm start itself). The persistent
    arms take ``plan.persistent_teacher``."""
    domain = "squad" if arm.startswith("squad") else "ladder"
    spec = ON_POLICY.get(arm, {})
    teacher = spec.get("teacher") or (plan.persistent_teacher if arm.startswith("opd_persistent") else "sft")
    if teacher in ("rl", "t0"):
        return f"{teacher}-{seed}"
    if teacher == "hint":
        return "ladder-hint"
    privileged = spec.get("context") is TeacherContext.privileged
    return f"{domain}-privileged" if privileged and plan.privileged_teacher_sft else domain


def teacher_name(key: str) -> str:
    """``t0``, ``sft``, ``rl``, ``hint`` or ``privileged`` for a teacher key (``records`` names teachers so)."""
    base = key.split("-")[0] if key.startswith(("rl-", "t0-")) else key.partition("-")[2] or "sft"
    return "sft" if key == "squad" else base


def uses_teacher(arm: str) -> bool:
    """Whether an arm reads a teacher: its term (``kd``) or its samples (``seqkd``)."""
    spec = ON_POLICY.get(arm, {})
    return bool(spec.get("kd") or spec.get("seqkd"))


def teacher_keys(plan: Plan) -> list[str]:
    """Every teacher the plan's arms distil from (or evaluate: ``teacher_ladder``), in a stable order."""
    keys = {teacher_key(plan, a, s) for a in plan.arms if uses_teacher(a) for s in arm_seeds(plan, a)}
    keys |= {"ladder"} if "teacher_ladder" in plan.arms else set()
    keys |= {"ladder-hint"} if "teacher_hint" in plan.arms else set()
    keys |= {f"rl-{s}" for s in range(plan.seeds)} if "teacher_rl" in plan.arms else set()
    if any(k.startswith(("rl-", "ladder-hint")) for k in keys):  # their gates compare with each seed's T0
        keys |= {f"t0-{s}" for s in range(plan.seeds)}
    return sorted(keys)


def arm_seeds(plan: Plan, arm: str) -> range:
    """The training seeds of an arm: one for a model that is not trained per seed (base, the teacher)."""
    return range(1) if arm in ONCE else range(plan.seeds)


def eval_key(arm: str, seed: str | int, ladder: bool, real: bool) -> str:
    """The state phase of an arm-seed's evaluation on the ladder and/or real text (``Bench.evaluate``)."""
    return f"eval/{arm}/{seed}/{int(ladder)}{int(real)}"


def arm_flags(arm: str) -> tuple[bool, bool]:
    """(evaluated on the ladder, evaluated on real text)"""
    return not arm.startswith("squad"), arm in REAL_ARMS


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
    # T_rl first: the longest teacher, and the arms of the last line wait for it
    keys = sorted(teacher_keys(plan), key=lambda k: not k.startswith("rl-"))
    return [*warm, *[("teacher", k) for k in keys], *rest[:cut], ("base", 0), *rest[cut:]]


def rollout_seed(seed: int, r: int, base: int = 100) -> int:
    """The sampling seed of round ``r`` of training seed ``seed``: 100 + 10 x seed + r for the first ten rounds (the
    seeds every folder has used), then 100000 + 1000 x seed + r, so that no two seeds' rounds share tasks; T_rl's
    rounds (``base`` 200000) use 200000 + 1000 x seed + r."""
    if base == 100 and r < 10:
        return 100 + 10 * seed + r
    return (100_000 if base == 100 else base) + 1000 * seed + r

