"""Supervised fine-tuning on stored calls (``SftConfig``), and the on-policy loop's warm start
(``WarmStartConfig``)."""

from __future__ import annotations

from pydantic import Field, field_validator, model_validator

from agentmem.config.base import Frozen, Kinds, MixedPrecision
from agentmem.config.choices import DType, LrSchedule, RLKind, Weighting
from agentmem.config.distill_config import (
    BatchSection,
    DistillConfig,
    LossSection,
    OptimSection,
    RLSection,
    TeacherSection,
)
from agentmem.records import SamplingContext


# sft's optimizer defaults, where they differ from distill's (``OptimSection``: 10 steps at 1e-5, no warmup,
# constant): the warm-start recipe measured in docs/learning.md (16 steps at 5e-5, one warmup step, cosine); at
# distill's defaults the README's path learned to write `(empty)` and gained nothing
def _sft_optim() -> OptimSection:
    return OptimSection(steps=16, lr=5e-5, warmup_steps=1, schedule=LrSchedule.cosine)


# LoRA targets of llama-style models (Llama, Qwen2, SmolLM2): every attention and MLP projection.
LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


class SftConfig(Frozen):
    """Supervised fine-tuning on stored calls (``agentmem sft``): cross-entropy on the action tokens only,
    on the distill job's rebuild -> pack -> forward path (``distill_config`` gives the ``DistillConfig``
    the ``Trainer`` runs: the cross-entropy term alone, no teacher, no RL). The calls are those of
    ``run_ids`` (oracle runs, a teacher's runs or the student's own), of ``kinds`` (``update`` is an alias
    of ``memory_update``; a comma-separated string is accepted), of episodes with ``f1 >= min_f1`` when
    given. ``lora_rank``: train LoRA adapters on ``lora_targets`` instead of every weight (the saved
    checkpoints hold the merged weights). The optimizer and batch sections are distill's (``OptimSection``,
    ``BatchSection``), with sft's own optimizer defaults (``_sft_optim``)."""

    run_ids: list[str] = Field(min_length=1)
    """Run id(s) whose stored calls to train on: oracle runs, a teacher's runs or the student's own."""
    student: str = "default"
    """Student: model folder, checkpoint id or 'default'."""
    min_f1: float | None = Field(None, ge=0, le=1)
    """Train only on calls of episodes with F1 >= this (e.g. a student's own successful episodes)."""
    kinds: Kinds = None
    """Call kinds to train on: memory_update (alias update), answer, or a memory policy's own (route,
    event_view, log_search, ...). Default: all."""
    lora_rank: int | None = Field(None, ge=1)
    """Train LoRA adapters of this rank instead of every weight; checkpoints hold the merged weights."""
    lora_alpha: float = Field(16.0, gt=0)
    """LoRA scaling numerator (scale = alpha / rank)."""
    lora_dropout: float = Field(0.0, ge=0, lt=1)
    """Dropout on the LoRA input."""
    lora_targets: list[str] = Field(default_factory=lambda: list(LORA_TARGETS), min_length=1)
    """Modules that get LoRA adapters."""
    seed: int = 0
    """Seed of the data order (and of the LoRA initialisation)."""
    out: str = "checkpoints"
    """Folder for checkpoints."""
    save_every: int | None = Field(None, ge=1)
    """Save a checkpoint every N steps (and at the end)."""
    keep_last: int | None = Field(None, ge=1)
    """Keep only the run's last N checkpoint folders, deleting older ones as new ones are saved. Default: keep
    every one (each is the model alone: only the latest keeps the optimizer state)."""
    keep_optimizer: bool = False
    """Keep the optimizer state (twice the model's size) in the finished run's last checkpoint, so that
    --resume --steps N can extend the run or a later job can start from it with --carry-optimizer. A running
    job always keeps it in its latest checkpoint, so a killed run resumes exactly."""
    weighting: Weighting = Weighting.token
    """Token averaging over the global step: every token, every call or every episode equal."""
    dtype: DType = DType.float32
    """Weights dtype of training (bf16 is faster on most CPUs)."""
    mixed_precision: MixedPrecision = False
    """The student's (and the anchor reference's) decoder under bfloat16 autocast, the weights, gradients,
    AdamW state and the output head in float32 (as in distill). Needs --train-dtype float32."""
    anchor_weight: float = Field(0.0, ge=0)  # x KL(student || frozen starting student), as in distill
    """Weight of KL(student || frozen starting student), OPTD's frozen anchor against drift (the starting
    weights, without LoRA adapters)."""
    # privileged: the model learns the stored outputs under the privileged message (gold answer and evidence)
    # spliced before each prompt, exactly what the ``privileged`` teacher context reads: a privileged teacher
    # fine-tuned in its own context. Never a student's recipe: a student reads only its own prompt
    context: SamplingContext = SamplingContext.aligned
    """Prompt the model is trained under: aligned (the stored prompt, what a student reads), privileged (the
    episode's gold answer and evidence as a system message before every prompt: the SFT of a privileged
    teacher for `distill --context privileged`, which reads the same splice) or hint (before each memory
    update, one line saying whether its chunk holds a fact about the question's entity: the hint teacher's SFT
    for `distill --context hint`)."""

    optim: OptimSection = Field(default_factory=_sft_optim)
    """AdamW: steps in all (on --resume, the stored value unless given), learning rate and schedule, weight
    decay, gradient clip, the state carried in (an earlier sft's or distill's, full-parameter training only)."""
    batch: BatchSection = Field(default_factory=BatchSection)
    """Calls per step and their layout in packed rows."""

    @model_validator(mode="after")
    def _optimizer(self) -> SftConfig:
        if self.optim.carry_optimizer and self.lora_rank is not None:
            raise ValueError("optim.carry_optimizer restores a full-parameter AdamW state: it cannot start LoRA "
                             "adapters (leave out --lora-rank or --carry-optimizer)")
        if self.optim.coast:
            raise ValueError("optim.coast takes steps with zero gradients: a distill option, not sft's")
        return self

    def distill_config(self) -> DistillConfig:
        """The ``DistillConfig`` of the same training: cross-entropy (weight 1) on the action tokens only
        (plus the anchor term when ``anchor_weight > 0``)."""
        return DistillConfig(
            run_ids=self.run_ids, student=self.student, kinds=self.kinds, seed=self.seed, out=self.out,
            save_every=self.save_every, dtype=self.dtype, mixed_precision=self.mixed_precision,
            teacher=TeacherSection(model=None),
            loss=LossSection(kd_weight=0.0, rl_weight=0.0, ce_weight=1.0, anchor_weight=self.anchor_weight,
                             weighting=self.weighting),
            rl=RLSection(kind=RLKind.none), optim=self.optim, batch=self.batch)


class WarmStartConfig(SftConfig):
    """``TrainConfig.warm_start``: an SFT before round 1 with sft's defaults (docs/learning.md: 16 steps at 5e-5,
    one warmup step, cosine), which keeps its optimizer state for round 1. Stored as an ``SftConfig``'s fields."""

    keep_optimizer: bool = True
    """Keep the optimizer state in the warm start's checkpoint: round 1 starts from it (as --carry-optimizer
    does)."""

    @field_validator("context")
    @classmethod
    def _student_reads_its_own_prompt(cls, value: SamplingContext) -> SamplingContext:
        if value is not SamplingContext.aligned:
            raise ValueError("the warm start trains the student, which reads only its own prompt: context must be "
                             "aligned (a privileged SFT is a privileged teacher's: `agentmem sft --context privileged`)")
        return value

