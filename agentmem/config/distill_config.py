"""Training from stored calls: ``DistillConfig``."""

from __future__ import annotations

from typing import Any

from pydantic import Field, NonNegativeFloat, ValidationInfo, field_validator, model_validator

from agentmem.config.base import Frozen, kind_names, mixed_over_float32
from agentmem.config.choices import (
    AttentionPath,
    DistillTarget,
    Divergence,
    DType,
    KdForm,
    LrSchedule,
    Oversize,
    Packing,
    PsdMode,
    RewardKind,
    RLKind,
    TeacherCentering,
    TeacherSourceKind,
    TeacherTruncation,
    Weighting,
)
from agentmem.records import CallKind, TeacherContext


class DistillConfig(Frozen):
    """Training from stored calls: the objective is a weighted sum of terms (``kd_weight`` ×
    divergence to the teacher, ``rl_weight`` × clipped policy gradient on the final reward,
    ``ce_weight`` × cross-entropy on action tokens, ``anchor_weight`` × KL to the frozen starting
    student). ``run_ids`` may be empty only inside a ``TrainConfig`` (each round fills it). ``target``
    and the ``alpha_*``/``prob_floor`` options choose DemoPSD's barycenter target, ``jsd_clip`` OPSD's
    per-token clip of the divergence (docs/methods.md)."""

    run_ids: list[str] = Field(default_factory=list)
    """Run id(s) to train on (a train run's rounds set it themselves)."""
    student: str = "default"
    """Student: model folder, checkpoint id or 'default'."""
    teacher: str | None = "default"
    """Teacher (same tokenizer as the student); 'none' for RL only."""
    teacher_source: TeacherSourceKind = TeacherSourceKind.model
    """Teacher targets: model (run online on packed rows) | shards (top-K log-probs written by `agentmem score
    --topk`) | scores (stored per-token teacher log-probs of `agentmem score`)."""
    context: TeacherContext = TeacherContext.aligned
    """Teacher context: aligned (the student's own state) | persistent (earlier calls concatenated as stored)
    | persistent_chat (the episode as one multi-turn chat) | privileged (gold answer and evidence before the
    prompt)."""
    # call kinds the teacher scores in the aligned context whatever ``context`` is: e.g. ``[answer]`` with
    # ``persistent`` measures the persistent context on update calls alone (teacher_source=model only)
    aligned_kinds: list[CallKind] | None = None
    """Call kinds the teacher scores in the aligned context whatever --teacher-context is, e.g. answer with
    persistent (--teacher-source model only). Default: none."""
    loss: Divergence = Divergence.reverse_kl
    """Divergence at action positions."""
    beta: float = Field(0.5, ge=0, le=1)
    """Generalised JSD interpolation (TRL semantics)."""
    temperature: float = Field(1.0, gt=0)
    """Temperature of both distributions in the divergence."""
    teacher_temperature: float = Field(1.0, gt=0)
    """Sharpen (below 1) or flatten (above 1) the teacher's distribution before the divergence: its log-probs
    are divided by this, so the target is p_t^(1/tau) renormalised (towards the teacher's greedy choice as tau
    goes to 0). Full-distribution teachers only (not --teacher-source scores)."""
    teacher_min_confidence: float = Field(0.0, ge=0, lt=1)
    """Distil only where the teacher is decided: a sampled position whose teacher top probability is below this
    gets no distillation term (the other terms, e.g. the RL term, still apply there). 0: every position.
    Full-distribution teachers only. The share of weight left out is logged as kd_gated_fraction."""
    teacher_centering: TeacherCentering = TeacherCentering.none
    """first_token: at each call's first output token, subtract from the teacher term's push its mean over the
    step's calls of the same kind (a group baseline: the teacher moves how calls differ, not what they share;
    one extra no-gradient forward of the student per step); first_token_memory: over the calls of the same kind
    whose memory was empty too, or held something too. Full-distribution teachers, target teacher only. The
    shared part's share of the push is logged as kd_shared_fraction."""
    rl: RLKind = RLKind.grpo
    """RL term on the final reward."""
    kd_weight: float = Field(1.0, ge=0)
    """Weight of the distillation term (with kd_form advantage: the teacher's coefficient in the advantage)."""
    kd_form: KdForm = KdForm.additive
    """additive: the distillation term beside the RL term; advantage: no distillation term, the RL term's advantage
    minus kd_weight x (log p_sampler - log p_teacher) at each sampled token (needs rl=grpo and a teacher)."""
    rl_weight: float = Field(1.0, ge=0)
    """Weight of the policy-gradient term."""
    ce_weight: float = Field(0.0, ge=0)
    """Weight of cross-entropy on the action tokens."""
    anchor_weight: float = Field(0.0, ge=0)
    """Weight of KL(student || frozen starting student), OPTD's frozen anchor against drift (in train: each
    round's starting checkpoint; in sft: the starting weights, without LoRA adapters)."""
    loss_terms: dict[str, NonNegativeFloat] = Field(default_factory=dict)
    """Weights of the loss terms that installed packages add (docs/design.md, plug-ins), by name: NAME=WEIGHT."""
    normalize_std: bool = False
    """Divide advantages by the group's std."""
    clip_eps: float = Field(0.2, ge=0)
    """Clip range of the policy-gradient ratio (PPO-style)."""
    weighting: Weighting = Weighting.token
    """Token averaging over the global step: every token, every call or every episode equal."""
    steps: int = Field(10, ge=1)
    """Optimizer steps (train: per round, fresh rollouts every this many steps; on --resume of distill, the
    stored value unless given)."""
    invocations_per_step: int = Field(8, ge=1)
    """Stored calls per optimizer step."""
    row_tokens: int = Field(4096, ge=16)
    """Tokens per packed row."""
    lr: float = Field(1e-5, gt=0)
    """Peak AdamW learning rate."""
    # The learning-rate schedule over the global step ``schedule_offset + step`` of ``schedule_steps`` steps
    # (default: this job's ``steps``); ``agentmem train`` sets offset and length so that one schedule spans
    # every round.
    warmup_steps: int = Field(0, ge=0)
    """Linear warmup steps (step s at lr x (s+1)/(warmup+1); train: over all rounds)."""
    schedule: LrSchedule = LrSchedule.constant
    """Learning rate after warmup: constant, or cosine decay to --min-lr-ratio x lr at the schedule's last step
    (train: the last round's)."""
    min_lr_ratio: float = Field(0.1, ge=0, le=1)
    """Cosine schedule: the last step's learning rate as a share of lr."""
    schedule_offset: int = Field(0, ge=0)
    """Global step the schedule starts at (train sets it per round)."""
    schedule_steps: int | None = Field(None, ge=1)
    """Length of the schedule in steps (default: steps; train sets it to span every round)."""
    # Start AdamW from the state saved in the student's checkpoint folder (the previous round's), so its
    # moments carry across rounds instead of restarting each round.
    carry_optimizer: bool = False
    """Start AdamW from the state saved in the student's checkpoint folder (a previous distill's; train:
    carried from round to round)."""
    carry_first_moment: bool = True
    """With --carry-optimizer (without it, no state is carried and this is moot): also carry AdamW's first
    moment (its running mean of the earlier job's gradients). --no-carry-first-moment starts it at zero and
    keeps the second moment and step count: the carried state sets each weight's step size but pushes along no
    earlier direction (train: round 1 only, the one that starts from --init or the warm start, and off by
    default there; later rounds carry their own)."""
    reward: RewardKind = RewardKind.f1
    """Episode reward of the RL term: f1 (the stored reward), sub_em (a gold answer inside the prediction) or
    max_f1_sub_em (their maximum)."""
    # Load the frozen starting student to log KL(student || start) every step (``train_steps.metrics``).
    monitor_start_kl: bool = False
    """Also load the starting student to log KL(student || start) every step."""
    weight_decay: float = Field(0.0, ge=0)
    """AdamW weight decay."""
    max_grad_norm: float = Field(1.0, gt=0)
    """Gradient norm clip."""
    seed: int = 0
    """Seed of the data order."""
    out: str = "checkpoints"
    """Folder for checkpoints (train: OUT/T/round-N/<distill run>/step-K)."""
    save_every: int | None = Field(None, ge=1)
    """Save a checkpoint every N steps (and at the end)."""
    kinds: list[CallKind] | None = None
    """Call kinds to train on: memory_update (alias update), answer, or a memory policy's own (route,
    event_view, log_search, ...). Default: all."""
    path: AttentionPath = AttentionPath.fast
    """Packed attention path: fast (per-segment attention, flash-attn varlen on CUDA) or reference (a 4-D
    block mask)."""
    packing: Packing = Packing.segments
    """Row layout: segments (each call whole) or shared_prefix (a (run, task, step) group's common prompt
    prefix placed and computed once; exact)."""
    oversize: Oversize = Oversize.error
    """A stored call longer than --row-tokens: error, or skip (left out and counted). Never cut."""
    teacher_truncation: TeacherTruncation = TeacherTruncation.error
    """A teacher context longer than --row-tokens: error, or left (cut from the left, counted)."""
    dtype: DType = DType.float32
    """Weights dtype of training: the student's and the teacher's."""
    mixed_precision: bool = False
    """The student's, the teacher's and the reference's decoders run under bfloat16 autocast (matmuls and
    attention in bf16) while the weights, gradients, AdamW state and the output head stay in float32: a 1.6x
    (8 short calls) to 2x (a 2,048-token row) faster training step on CPUs with AMX or AVX512-BF16, slower where
    bf16 is emulated (AVX2). The logits differ from float32's by the decoder's rounding (docs/training.md). Needs
    --train-dtype float32."""
    # The distillation target (DemoPSD's barycenter) and OPSD's per-token clip; docs/methods.md.
    target: DistillTarget = DistillTarget.teacher
    """What the distillation term pulls towards: teacher (its distribution) or barycenter (DemoPSD: q ∝
    p_teacher^alpha p_student^(1-alpha) per token, alpha = exp(-JSD/tau) from their disagreement)."""
    alpha_tau: float = Field(0.1, gt=0)
    """Barycenter: tau of alpha = exp(-D / tau), D the top-K-union JSD (at most ln 2 = 0.69)."""
    alpha_topk: int = Field(20, ge=1)
    """Barycenter: K, the JSD is taken on the union of teacher's and student's top-K tokens."""
    alpha_min: float = Field(0.0, ge=0, le=1)
    """Barycenter: lower clamp of alpha."""
    alpha_max: float = Field(1.0, ge=0, le=1)
    """Barycenter: upper clamp of alpha."""
    alpha_ema: float = Field(0.0, ge=0, lt=1)
    """Barycenter: decay of a running mean of alpha over steps, blended into each token's alpha (0 = off;
    saved in checkpoints, restored by --resume)."""
    prob_floor: float = Field(0.0, ge=0, lt=1)
    """Barycenter: raise every target probability to at least this, then renormalise (0 = off)."""
    jsd_clip: float | None = Field(None, gt=0)
    """OPSD clip: cap each token's divergence at C (min(D, C); a clipped token gets no gradient;
    train_steps.metrics.kd_clip_fraction). Any --loss, either --target. Default: no clip."""
    # Pseudo self-distillation: whose samples the privileged teacher scores, and the off-policy share of mixed.
    psd: PsdMode = PsdMode.none
    """Pseudo self-distillation (needs --context privileged): whose samples the privileged teacher scores:
    on_policy (the student's rollouts), off_policy (`rollout --context privileged` runs), mixed (one of each;
    loss (1 - m) L_on + m L_off, m = --psd-mix). Checks the runs before any model loads."""
    psd_mix: float = Field(0.5, ge=0, le=1)
    """PSD mixed: m, the off-policy part's share of the step loss (each part's tokens weighted within the
    part; each step draws half its calls from each)."""

    @field_validator("kinds", "aligned_kinds", mode="before")
    @classmethod
    def _kind_names(cls, value: Any) -> Any:
        return kind_names(value)

    @field_validator("mixed_precision")
    @classmethod
    def _mixed_over_float32(cls, value: bool, info: ValidationInfo) -> bool:
        return mixed_over_float32(value, info)

    @field_validator("psd")
    @classmethod
    def _psd_is_privileged(cls, value: PsdMode, info: ValidationInfo) -> PsdMode:
        if value is PsdMode.none:
            return value
        if info.data.get("context") is not TeacherContext.privileged:
            raise ValueError(f"psd={value.value} distils from the privileged teacher: set context=privileged")
        if not (info.data.get("teacher") and info.data.get("kd_weight")):
            raise ValueError(f"psd={value.value} needs a teacher and kd_weight > 0")
        if value is PsdMode.mixed and info.data.get("invocations_per_step", 2) < 2:
            raise ValueError("psd=mixed draws calls of both kinds every step: invocations_per_step must be >= 2")
        return value

    @field_validator("psd_mix")
    @classmethod
    def _mixed_only(cls, value: float, info: ValidationInfo) -> float:
        if info.data.get("psd") is not PsdMode.mixed and value != cls.model_fields["psd_mix"].default:
            raise ValueError("psd_mix weights the off-policy loss of psd=mixed: set psd=mixed or leave it at its "
                             "default")
        return value

    @field_validator("target", "jsd_clip")
    @classmethod
    def _needs_full_teacher(cls, value: Any, info: ValidationInfo) -> Any:
        if value in (None, DistillTarget.teacher):
            return value
        name = f"{info.field_name}={value}"
        if info.data.get("teacher_source") is TeacherSourceKind.scores:
            raise ValueError(f"{name} needs the teacher's full distribution: teacher_source=scores stores only the "
                             "sampled token's log-prob (use teacher_source model or shards)")
        if not (info.data.get("teacher") and info.data.get("kd_weight")):
            raise ValueError(f"{name} shapes the distillation term: it needs a teacher and kd_weight > 0")
        return value

    @field_validator("teacher_temperature", "teacher_min_confidence")
    @classmethod
    def _tempered_needs_full_teacher(cls, value: float, info: ValidationInfo) -> float:
        default = cls.model_fields[str(info.field_name)].default
        if value != default and info.data.get("teacher_source") is TeacherSourceKind.scores:
            raise ValueError(f"{info.field_name}={value} reads the teacher's full distribution: "
                             "teacher_source=scores stores only the sampled token's log-prob (use teacher_source "
                             "model or shards)")
        return value

    @field_validator("alpha_tau", "alpha_topk", "alpha_min", "alpha_max", "alpha_ema", "prob_floor")
    @classmethod
    def _barycenter_only(cls, value: Any, info: ValidationInfo) -> Any:
        field_name = str(info.field_name)
        if info.data.get("target") is not DistillTarget.barycenter and value != cls.model_fields[field_name].default:
            raise ValueError(f"{info.field_name} is an option of the barycenter target: set target=barycenter "
                             "or leave it at its default")
        if info.field_name == "alpha_max" and value < info.data.get("alpha_min", 0.0):
            raise ValueError(f"alpha_max ({value}) must be >= alpha_min ({info.data['alpha_min']})")
        return value

    @model_validator(mode="before")
    @classmethod
    def _legacy(cls, data: Any) -> Any:
        if isinstance(data, dict) and "truncate" in data:  # runs stored before the field was split
            data = dict(data)
            if data.pop("truncate") == "left":
                data.setdefault("oversize", "skip")
                data.setdefault("teacher_truncation", "left")
        return data

    @model_validator(mode="after")
    def _consistent(self) -> DistillConfig:
        if self.teacher is None and self.kd_weight and self.teacher_source is not TeacherSourceKind.model:
            raise ValueError("teacher_source needs a teacher: give teacher or set kd_weight to 0")
        if self.teacher_centering is not TeacherCentering.none:
            if not self.effective_kd_weight:
                raise ValueError(f"teacher_centering={self.teacher_centering} shapes the distillation term: it needs "
                                 "a teacher and kd_weight > 0")
            if self.teacher_source is TeacherSourceKind.scores:
                raise ValueError(f"teacher_centering={self.teacher_centering} reads the teacher's full distribution: "
                                 "teacher_source=scores stores only the sampled token's log-prob (use teacher_source "
                                 "model or shards)")
            if self.target is not DistillTarget.teacher:
                raise ValueError(f"teacher_centering={self.teacher_centering} centres the push towards the teacher; "
                                 f"target={self.target} builds its target from the student (leave one at its default)")
        if self.kd_form is KdForm.advantage and not (self.effective_kd_weight and self.effective_rl_weight):
            raise ValueError("kd_form=advantage puts the teacher in the RL term's advantage: it needs a teacher, "
                             "kd_weight > 0, rl=grpo and rl_weight > 0")
        if self.kd_form is KdForm.advantage and self.teacher_centering is not TeacherCentering.none:
            raise ValueError("kd_form=advantage has no distillation term to centre: leave teacher_centering none")
        if not (self.effective_kd_weight or self.effective_rl_weight or self.ce_weight or self.anchor_weight
                or any(self.loss_terms.values())):
            raise ValueError("every loss term has weight 0: set kd_weight (with a teacher), rl_weight (with rl=grpo),"
                             " ce_weight, anchor_weight or a loss_terms weight")
        return self

    @property
    def effective_kd_weight(self) -> float:
        return self.kd_weight if self.teacher else 0.0

    @property
    def effective_rl_weight(self) -> float:
        return self.rl_weight if self.rl is RLKind.grpo else 0.0

