"""Training from stored calls: ``DistillConfig``, its fields in five sections (``teacher``, ``loss``, ``rl``,
``optim``, ``batch``) beside the few that say what is trained on and how it is kept."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field, NonNegativeFloat, ValidationInfo, field_validator, model_validator

from agentmem.config.base import Frozen, Kinds, MixedPrecision, PackedPath, RowLayout
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
from agentmem.records import TeacherContext

__all__ = ["BatchSection", "DistillConfig", "LossSection", "OptimSection", "RLSection", "TeacherSection"]

_SCORES_ONLY = ("teacher.source=scores stores only the sampled token's log-prob (use teacher.source model or "
                "shards)")


def _default_of(model: type[BaseModel], name: str) -> Any:
    return model.model_fields[name].default


class TeacherSection(Frozen):
    """The teacher: which model, where its targets come from, the context it reads, how its distribution is
    shaped, and pseudo self-distillation (PSD: whose samples the privileged teacher scores)."""

    model: str | None = "default"
    """Teacher (same tokenizer as the student); 'none' for RL only."""
    source: TeacherSourceKind = TeacherSourceKind.model
    """Teacher targets: model (run online on packed rows) | shards (top-K log-probs written by `agentmem score
    --topk`) | scores (stored per-token teacher log-probs of `agentmem score`)."""
    context: TeacherContext = TeacherContext.aligned
    """Teacher context: aligned (the student's own state) | persistent (earlier calls concatenated as stored)
    | persistent_chat (the episode as one multi-turn chat) | privileged (gold answer and evidence before the
    prompt)."""
    # call kinds the teacher scores in the aligned context whatever ``context`` is: e.g. ``[answer]`` with
    # ``persistent`` measures the persistent context on update calls alone (source=model only)
    aligned_kinds: Kinds = None
    """Call kinds the teacher scores in the aligned context whatever --teacher-context is, e.g. answer with
    persistent (--teacher-source model only). Default: none."""
    temperature: float = Field(1.0, gt=0)
    """Sharpen (below 1) or flatten (above 1) the teacher's distribution before the divergence: its log-probs
    are divided by this, so the target is p_t^(1/tau) renormalised (towards the teacher's greedy choice as tau
    goes to 0). Full-distribution teachers only (not --teacher-source scores)."""
    min_confidence: float = Field(0.0, ge=0, lt=1)
    """Distil only where the teacher is decided: a sampled position whose teacher top probability is below this
    gets no distillation term (the other terms, e.g. the RL term, still apply there). 0: every position.
    Full-distribution teachers only. The share of weight left out is logged as kd_gated_fraction."""
    truncation: TeacherTruncation = TeacherTruncation.error
    """A teacher context longer than --row-tokens: error, or left (cut from the left, counted)."""
    # Pseudo self-distillation: whose samples the privileged teacher scores, and the off-policy share of mixed.
    psd: PsdMode = PsdMode.none
    """Pseudo self-distillation (needs --context privileged): whose samples the privileged teacher scores:
    on_policy (the student's rollouts), off_policy (`rollout --context privileged` runs), mixed (one of each;
    loss (1 - m) L_on + m L_off, m = --psd-mix). Checks the runs before any model loads."""
    psd_mix: float = Field(0.5, ge=0, le=1)
    """PSD mixed: m, the off-policy part's share of the step loss (each part's tokens weighted within the
    part; each step draws half its calls from each)."""

    @field_validator("temperature", "min_confidence")
    @classmethod
    def _tempered_needs_full_teacher(cls, value: float, info: ValidationInfo) -> float:
        if value != _default_of(cls, str(info.field_name)) and info.data.get("source") is TeacherSourceKind.scores:
            raise ValueError(f"teacher.{info.field_name}={value} reads the teacher's full distribution: "
                             + _SCORES_ONLY)
        return value

    @field_validator("psd_mix")
    @classmethod
    def _mixed_only(cls, value: float, info: ValidationInfo) -> float:
        if info.data.get("psd") is not PsdMode.mixed and value != _default_of(cls, "psd_mix"):
            raise ValueError("psd_mix weights the off-policy loss of psd=mixed: set psd=mixed or leave it at its "
                             "default")
        return value


class LossSection(Frozen):
    """The objective: a weighted sum of terms (``kd_weight`` × divergence to the teacher, ``rl_weight`` ×
    clipped policy gradient on the final reward, ``ce_weight`` × cross-entropy on action tokens,
    ``anchor_weight`` × KL to the frozen starting student, ``terms``: plug-in terms), and the shape of the
    distillation term: ``target`` and the ``alpha_*``/``prob_floor`` options choose DemoPSD's barycenter target,
    ``jsd_clip`` OPSD's per-token clip of the divergence (docs/methods.md)."""

    divergence: Divergence = Divergence.reverse_kl
    """Divergence at action positions."""
    beta: float = Field(0.5, ge=0, le=1)
    """Generalised JSD interpolation (TRL semantics)."""
    temperature: float = Field(1.0, gt=0)
    """Temperature of both distributions in the divergence."""
    kd_weight: float = Field(1.0, ge=0)
    """Weight of the distillation term (with --kd-form advantage: the teacher's coefficient in the advantage)."""
    kd_form: KdForm = KdForm.additive
    """additive: the distillation term beside the RL term; advantage: no distillation term, the RL term's advantage
    minus --kd-weight x (log p_sampler - log p_teacher) at each sampled token (needs --rl grpo and a teacher)."""
    rl_weight: float = Field(1.0, ge=0)
    """Weight of the policy-gradient term."""
    ce_weight: float = Field(0.0, ge=0)
    """Weight of cross-entropy on the action tokens."""
    anchor_weight: float = Field(0.0, ge=0)
    """Weight of KL(student || frozen starting student), OPTD's frozen anchor against drift (in train: each
    round's starting checkpoint; in sft: the starting weights, without LoRA adapters)."""
    terms: dict[str, NonNegativeFloat] = Field(default_factory=dict)
    """Weights of the loss terms that installed packages add (docs/design.md, plug-ins), by name: NAME=WEIGHT."""
    weighting: Weighting = Weighting.token
    """Token averaging over the global step: every token, every call or every episode equal."""
    teacher_centering: TeacherCentering = TeacherCentering.none
    """first_token: at each call's first output token, subtract from the teacher term's push its mean over the
    step's calls of the same kind (a group baseline: the teacher moves how calls differ, not what they share;
    one extra no-gradient forward of the student per step); first_token_memory: over the calls of the same kind
    whose memory was empty too, or held something too. Full-distribution teachers, target teacher only. The
    shared part's share of the push is logged as kd_shared_fraction."""
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

    @field_validator("alpha_tau", "alpha_topk", "alpha_min", "alpha_max", "alpha_ema", "prob_floor")
    @classmethod
    def _barycenter_only(cls, value: Any, info: ValidationInfo) -> Any:
        field_name = str(info.field_name)
        if info.data.get("target") is not DistillTarget.barycenter and value != _default_of(cls, field_name):
            raise ValueError(f"{info.field_name} is an option of the barycenter target: set target=barycenter "
                             "or leave it at its default")
        if info.field_name == "alpha_max" and value < info.data.get("alpha_min", 0.0):
            raise ValueError(f"alpha_max ({value}) must be >= alpha_min ({info.data['alpha_min']})")
        return value


class RLSection(Frozen):
    """The RL term: group-normalised policy gradient on the episode's final reward."""

    kind: RLKind = RLKind.grpo
    """RL term on the final reward."""
    reward: RewardKind = RewardKind.f1
    """Episode reward of the RL term: f1 (the stored reward), sub_em (a gold answer inside the prediction) or
    max_f1_sub_em (their maximum)."""
    normalize_std: bool = False
    """Divide advantages by the group's std."""
    clip_eps: float = Field(0.2, ge=0)
    """Clip range of the policy-gradient ratio (PPO-style)."""


class OptimSection(Frozen):
    """AdamW and its learning-rate schedule: how many steps, at what rate, and the state carried in."""

    steps: int = Field(10, ge=1)
    """Optimizer steps (train: per round, fresh rollouts every this many steps; on --resume of distill, the
    stored value unless given)."""
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
    weight_decay: float = Field(0.0, ge=0)
    """AdamW weight decay."""
    max_grad_norm: float = Field(1.0, gt=0)
    """Gradient norm clip."""
    # Start AdamW from the state saved in the student's checkpoint folder (the previous round's), so its
    # moments carry across rounds instead of restarting each round.
    carry_optimizer: bool = False
    """Start AdamW from the state saved in the student's checkpoint folder (a previous distill's; train:
    carried from round to round)."""
    coast: bool = False
    """Take every step with zero gradients: the weights move by the carried AdamW state alone (its first
    moment's momentum). The null method of the learning plan, which every method's move starts as. Needs
    --carry-optimizer and every loss weight 0; nothing is forwarded."""
    carry_first_moment: bool = True
    """With --carry-optimizer (without it, no state is carried and this is moot): also carry AdamW's first
    moment (its running mean of the earlier job's gradients). --no-carry-first-moment starts it at zero and
    keeps the second moment and step count: the carried state sets each weight's step size but pushes along no
    earlier direction (train: round 1 only, the one that starts from --student or the warm start, and off by
    default there; later rounds carry their own)."""

    @property
    def schedule_goes_on(self) -> bool:
        """Whether the learning-rate schedule goes on after this job's last step (``schedule_steps`` past
        ``schedule_offset + steps``: a train round but the last), so a later job continues this one's optimizer."""
        return self.schedule_steps is not None and self.schedule_offset + self.steps < self.schedule_steps


class BatchSection(Frozen):
    """What one optimizer step reads and how its calls are laid out in packed rows."""

    invocations_per_step: int = Field(8, ge=1)
    """Stored calls per optimizer step."""
    row_tokens: int = Field(4096, ge=16)
    """Tokens per packed row."""
    packing: RowLayout = Packing.segments
    path: PackedPath = AttentionPath.fast
    oversize: Oversize = Oversize.error
    """A stored call longer than --row-tokens: error, or skip (left out and counted). Never cut."""


class DistillConfig(Frozen):
    """Training from stored calls, in five sections: ``teacher``, ``loss`` (the terms and their weights),
    ``rl``, ``optim`` and ``batch``. ``run_ids`` may be empty only inside a ``TrainConfig`` (each round fills
    it). The checks that read two sections are this model's."""

    run_ids: list[str] = Field(default_factory=list)
    """Run id(s) to train on (a train run's rounds set it themselves)."""
    student: str = "default"
    """Student: model folder, checkpoint id or 'default'."""
    kinds: Kinds = None
    """Call kinds to train on: memory_update (alias update), answer, or a memory policy's own (route,
    event_view, log_search, ...). Default: all."""
    seed: int = 0
    """Seed of the data order."""
    out: str = "checkpoints"
    """Folder for checkpoints (train: OUT/T/round-N/<distill run>/step-K)."""
    save_every: int | None = Field(None, ge=1)
    """Save a checkpoint every N steps (and at the end)."""
    keep_last: int | None = Field(None, ge=1)
    """Keep only the run's last N checkpoint folders, deleting older ones as new ones are saved (train: within
    each round's distill run). Default: keep every one (each is the model alone: only the latest keeps the
    optimizer state)."""
    keep_optimizer: bool = False
    """Keep the optimizer state (twice the model's size) in the finished run's last checkpoint (train: the last
    round's), so that --resume --steps N can extend the run or a later job can start from it with
    --carry-optimizer. A running job always keeps it in its latest checkpoint, so a killed run resumes exactly,
    and so does a run whose learning-rate schedule goes on after its last step (train's rounds but the last:
    the next round carries it)."""
    dtype: DType = DType.float32
    """Weights dtype of training: the student's and the teacher's."""
    mixed_precision: MixedPrecision = False
    """The student's, the teacher's and the reference's decoders run under bfloat16 autocast (matmuls and
    attention in bf16) while the weights, gradients, AdamW state and the output head stay in float32: a 1.6x
    (8 short calls) to 2x (a 2,048-token row) faster training step on CPUs with AMX or AVX512-BF16, slower where
    bf16 is emulated (AVX2). The logits differ from float32's by the decoder's rounding (docs/training.md). Needs
    --train-dtype float32."""
    # Load the frozen starting student to log KL(student || start) every step (``train_steps.metrics``).
    monitor_start_kl: bool = False
    """Also load the starting student to log KL(student || start) every step."""
    teacher: TeacherSection = Field(default_factory=TeacherSection)
    """The teacher: model, target source, context, temperature, confidence gate, truncation, PSD."""
    loss: LossSection = Field(default_factory=LossSection)
    """The loss terms and their weights, the divergence, and the distillation target."""
    rl: RLSection = Field(default_factory=RLSection)
    """The RL term: its kind, reward, advantage normalisation and clip."""
    optim: OptimSection = Field(default_factory=OptimSection)
    """AdamW: steps, learning rate and schedule, weight decay, gradient clip, the state carried in."""
    batch: BatchSection = Field(default_factory=BatchSection)
    """Calls per step and their layout in packed rows."""

    @model_validator(mode="after")
    def _consistent(self) -> DistillConfig:
        teacher, loss = self.teacher, self.loss
        if teacher.model is None and loss.kd_weight and teacher.source is not TeacherSourceKind.model:
            raise ValueError("teacher.source needs a teacher: give teacher.model or set loss.kd_weight to 0")
        if teacher.psd is not PsdMode.none:
            if teacher.context is not TeacherContext.privileged:
                raise ValueError(f"psd={teacher.psd.value} distils from the privileged teacher: set "
                                 "teacher.context=privileged")
            if not (teacher.model and loss.kd_weight):
                raise ValueError(f"psd={teacher.psd.value} needs a teacher and loss.kd_weight > 0")
            if teacher.psd is PsdMode.mixed and self.batch.invocations_per_step < 2:
                raise ValueError("psd=mixed draws calls of both kinds every step: invocations_per_step must be >= 2")
        for name, value in (("target", loss.target), ("jsd_clip", loss.jsd_clip)):
            if value in (None, DistillTarget.teacher):
                continue
            if teacher.source is TeacherSourceKind.scores:
                raise ValueError(f"loss.{name}={value} needs the teacher's full distribution: " + _SCORES_ONLY)
            if not (teacher.model and loss.kd_weight):
                raise ValueError(f"loss.{name}={value} shapes the distillation term: it needs a teacher and "
                                 "loss.kd_weight > 0")
        if loss.teacher_centering is not TeacherCentering.none:
            if not self.effective_kd_weight:
                raise ValueError(f"teacher_centering={loss.teacher_centering} shapes the distillation term: it "
                                 "needs a teacher and loss.kd_weight > 0")
            if teacher.source is TeacherSourceKind.scores:
                raise ValueError(f"teacher_centering={loss.teacher_centering} reads the teacher's full "
                                 "distribution: " + _SCORES_ONLY)
            if loss.target is not DistillTarget.teacher:
                raise ValueError(f"teacher_centering={loss.teacher_centering} centres the push towards the teacher; "
                                 f"target={loss.target} builds its target from the student (leave one at its "
                                 "default)")
        if loss.kd_form is KdForm.advantage and not (self.effective_kd_weight and self.effective_rl_weight):
            raise ValueError("kd_form=advantage puts the teacher in the RL term's advantage: it needs a teacher, "
                             "kd_weight > 0, rl.kind=grpo and rl_weight > 0")
        if loss.kd_form is KdForm.advantage and loss.teacher_centering is not TeacherCentering.none:
            raise ValueError("kd_form=advantage has no distillation term to centre: leave teacher_centering none")
        weighted = (self.effective_kd_weight or self.effective_rl_weight or loss.ce_weight or loss.anchor_weight
                    or any(loss.terms.values()))
        if self.optim.coast:
            if weighted:
                raise ValueError("optim.coast takes every step with zero gradients: set every loss weight to 0 "
                                 "(kd_weight, rl_weight, ce_weight, anchor_weight, loss.terms)")
            if not self.optim.carry_optimizer:
                raise ValueError("optim.coast moves the weights by a carried AdamW state: it needs "
                                 "optim.carry_optimizer")
        elif not weighted:
            raise ValueError("every loss term has weight 0: set kd_weight (with a teacher), rl_weight (with "
                             "rl.kind=grpo), ce_weight, anchor_weight or a loss.terms weight")
        return self

    @property
    def effective_kd_weight(self) -> float:
        return self.loss.kd_weight if self.teacher.model else 0.0

    @property
    def effective_rl_weight(self) -> float:
        return self.loss.rl_weight if self.rl.kind is RLKind.grpo else 0.0

