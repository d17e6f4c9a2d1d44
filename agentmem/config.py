"""One config tree for every job, and the Enums of every fixed choice.

Each job takes exactly one of these configs; a run stores ``config.model_dump(mode="json")`` so that
``--resume RUN_ID`` needs nothing else. The tree composes instead of re-declaring:

- ``AgentConfig``: how the agent reads (memory budget, generation limits, sampling, memory policy);
- ``RolloutConfig``: environment + model + an ``AgentConfig``;
- ``ReplayConfig``: ReOPD's single-call samples branched from a stored teacher run;
- ``EvalConfig``: a ``RolloutConfig`` that is greedy with one sample per task (checked), with held-out
  defaults;
- ``ScoreConfig``: teacher scoring of stored calls;
- ``DistillConfig``: training from stored calls (objective terms, teacher source, packing);
- ``TrainConfig``: the on-policy loop: a ``RolloutConfig`` and a ``DistillConfig`` per round.

Every fixed choice is an Enum (a ``str`` Enum, so stored JSON keeps plain strings and old runs load).
Device and threads are not here: they describe the process, not the job (``agentmem.runtime``).
"""

from __future__ import annotations

import enum
from typing import Any

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    NonNegativeFloat,
    ValidationInfo,
    field_validator,
    model_validator,
)

from agentmem.records import CallKind, InvocationKind, SamplingContext, TeacherContext

# Synthetic tasks are a pure function of (seed, index): a seed no rollout uses by default gives tasks the
# policy was never trained on. Data files are only reordered by the seed; hold out a split file for them.
HELD_OUT_SEED = 1000


class Choice(str, enum.Enum):
    """A str Enum whose ``str()`` is its value (so f-strings and typer print ``fast``, not ``Path.fast``)."""

    def __str__(self) -> str:
        return self.value


class Device(Choice):
    auto = "auto"
    cpu = "cpu"
    cuda = "cuda"


class DType(Choice):
    float32 = "float32"
    bfloat16 = "bfloat16"
    float16 = "float16"


class BackendKind(Choice):
    transformers = "transformers"
    vllm = "vllm"
    openai = "openai"  # an OpenAI-compatible server that returns token ids (``agentmem serve``; rollout only)


class Divergence(Choice):
    reverse_kl = "reverse_kl"
    forward_kl = "forward_kl"
    jsd = "jsd"


class DistillTarget(Choice):
    """What the distillation term pulls the student towards at each action position: the ``teacher``'s
    distribution, or the ``barycenter`` ``q ∝ p_t^alpha p_s^(1 - alpha)`` with alpha per token from the
    teacher-student discrepancy (DemoPSD; ``agentmem.training.barycenter``)."""

    teacher = "teacher"
    barycenter = "barycenter"


class RLKind(Choice):
    grpo = "grpo"
    none = "none"


class Weighting(Choice):
    """How action tokens are averaged over a global step: every token equal, every call equal, or every
    episode equal."""

    token = "token"
    call = "call"
    episode = "episode"


class AttentionPath(Choice):
    """``fast``: per-segment attention (flash-attn varlen on CUDA); ``reference``: a 4-D block mask."""

    fast = "fast"
    reference = "reference"


class Oversize(Choice):
    """What to do with a student call longer than the row budget: refuse the job, or leave the call out
    and count it. Never cut: a cut call is a state the student did not see."""

    error = "error"
    skip = "skip"


class TeacherTruncation(Choice):
    """What to do with a teacher context longer than the row budget (a long ``persistent`` history):
    refuse, or cut prompt tokens from the left (counted and shown). The student side is never cut."""

    error = "error"
    left = "left"


class Packing(Choice):
    """How calls are laid out in rows: ``segments`` (each call whole, attention blocked at every boundary)
    or ``shared_prefix`` (the calls of one (run, task, step) group share their longest common token
    prefix: it is placed and computed once, each call's suffix attends to it and to itself only, at the
    call's original positions; calls that share nothing fall back to segments)."""

    segments = "segments"
    shared_prefix = "shared_prefix"


class PromptLayout(Choice):
    """Order of the overwrite policy's update prompt: ``chunk-first`` (question, chunk, memory: the G
    samples of a task share most of the prompt) or ``memory-first`` (question, memory, chunk: MemAgent's
    order, the layout of stored runs made before the option existed)."""

    chunk_first = "chunk-first"
    memory_first = "memory-first"


class TeacherSourceKind(Choice):
    """Where teacher targets come from: a model run online on packed rows, top-K shards written by
    ``agentmem score --topk``, or stored per-token teacher log-probs (sampled-token estimator)."""

    model = "model"
    shards = "shards"
    scores = "scores"


class LrSchedule(Choice):
    """The learning rate against the global step: ``constant`` after warmup, or ``cosine`` decay from
    ``lr`` to ``lr * min_lr_ratio`` at the schedule's last step (``agentmem.training.schedule``)."""

    constant = "constant"
    cosine = "cosine"


class RewardKind(Choice):
    """The episode reward the RL term's group advantages use: ``f1``, the stored reward (a rollout stores
    its token F1; an episode without one, its F1), substring exact match ``sub_em`` (1 when a gold answer occurs in the prediction), or
    their maximum ``max_f1_sub_em`` (a right entity inside a sentence gets full credit: more groups with
    reward variance for a small model whose answers run long)."""

    f1 = "f1"
    sub_em = "sub_em"
    max_f1_sub_em = "max_f1_sub_em"


class PlotBy(Choice):
    step = "step"
    context_tokens = "context_tokens"


class PolicySource(Choice):
    """Who writes a rollout's outputs: the ``model`` (sampled, with log-probs) or the ``oracle`` (scripted
    from the task's evidence and gold answer, no model, no log-probs; ``agentmem.agent.oracle``)."""

    model = "model"
    oracle = "oracle"


class PsdMode(Choice):
    """Pseudo self-distillation (PSD, docs/methods.md): the teacher is the model under the ``privileged``
    context (gold answer and evidence); this names whose samples it scores. ``none``: no PSD (no check);
    ``on_policy``: the student's own rollouts; ``off_policy``: privileged rollouts (``agentmem rollout
    --context privileged``: sampled under the teacher's prompt); ``mixed``: both, the step loss
    ``(1 - psd_mix) * L_on + psd_mix * L_off``."""

    none = "none"
    on_policy = "on_policy"
    off_policy = "off_policy"
    mixed = "mixed"


class Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", use_enum_values=False)


class AgentConfig(Frozen):
    """How the agent reads: memory budget, generation limits, sampling, memory policy, prompt layout.

    ``prompt_layout`` defaults to ``chunk-first``; a stored config that has no such field (a run made
    before it existed) reads as ``memory-first``, the layout that run used (``AgentConfig.stored``)."""

    @classmethod
    def stored(cls, data: dict) -> AgentConfig:
        return cls.model_validate({"prompt_layout": PromptLayout.memory_first.value, **data})

    memory_tokens: int = Field(256, ge=1)
    answer_max_new_tokens: int = Field(32, ge=1)
    max_chunks: int | None = Field(None, ge=1)
    temperature: float = Field(1.0, ge=0)
    top_p: float = Field(1.0, gt=0, le=1)
    memory_policy: str = "overwrite"
    # the memory policy's own options (``--memory-option KEY=VALUE``), validated by the policy's factory
    memory_options: dict[str, Any] = Field(default_factory=dict)
    prompt_layout: PromptLayout = PromptLayout.chunk_first
    max_batch: int = Field(8, ge=1)
    seed: int = Field(0, ge=0)


class RolloutConfig(Frozen):
    """Everything a rollout depends on; stored with the run so ``--resume`` needs only the run id."""

    @classmethod
    def stored(cls, data: dict) -> RolloutConfig:
        """A config read back from a run row (see ``AgentConfig.stored`` for the one default that differs)."""
        data = dict(data)
        data["agent"] = AgentConfig.stored(data.get("agent") or {})
        return cls.model_validate(data)

    env: str = "synthetic"
    data: str | None = None
    env_knobs: dict[str, Any] = Field(default_factory=dict)
    model: str = "default"
    policy: PolicySource = PolicySource.model  # oracle: ``model`` gives only the tokenizer and chat template
    backend: BackendKind = BackendKind.transformers
    base_url: str | None = None  # backend openai: the server's /v1 URL (``agentmem serve``)
    # fp32 by default: on CPU it is faster end to end for long prompts (prefill dominates), and the stored
    # sampler log-probs then match the fp32 training recompute (bf16 differs by ~0.03 on average).
    dtype: DType = DType.float32
    episodes: int = Field(8, ge=1)
    group_size: int = Field(1, ge=1)
    seed: int = Field(0, ge=0)
    chunk_tokens: int = Field(512, ge=16)
    agent: AgentConfig = Field(default_factory=AgentConfig)
    # privileged: every call is sampled with the episode's privileged message (gold answer, evidence) spliced
    # before its prompt, stored apart from the student-visible prompt (PSD's off-policy samples)
    context: SamplingContext = SamplingContext.aligned

    @model_validator(mode="after")
    def _server(self) -> RolloutConfig:
        if (self.backend is BackendKind.openai) != (self.base_url is not None):
            raise ValueError("--backend openai and --base-url URL go together")
        return self

    @model_validator(mode="after")
    def _oracle_reads_no_prompt(self) -> RolloutConfig:
        if self.context is SamplingContext.privileged and self.policy is PolicySource.oracle:
            raise ValueError("the oracle reads no prompt: context privileged needs policy model")
        return self


def _greedy_agent() -> AgentConfig:
    return AgentConfig(memory_tokens=128, temperature=0.0, seed=HELD_OUT_SEED)


class EvalConfig(RolloutConfig):
    """A rollout that is greedy (temperature 0) with one sample per task, on held-out seeds by default.
    Stored as a run of kind ``eval`` with this config."""

    episodes: int = Field(16, ge=1)
    seed: int = Field(HELD_OUT_SEED, ge=0)
    agent: AgentConfig = Field(default_factory=_greedy_agent)

    @model_validator(mode="after")
    def _greedy_single_sample(self) -> EvalConfig:
        if self.group_size != 1:
            raise ValueError(f"an evaluation samples one episode per task: group_size must be 1, got {self.group_size}")
        if self.agent.temperature != 0:
            raise ValueError(f"an evaluation is greedy: agent.temperature must be 0, got {self.agent.temperature}")
        return self


class ScoreConfig(Frozen):
    """Teacher scoring of stored calls. ``temperature`` is the one temperature of both distributions in
    the stored divergence (the project's convention: KL(student_T || teacher_T), T = 1 by default, the
    same as distill's), stored with every score row."""

    run_ids: list[str] = Field(min_length=1)
    teacher: str = "default"
    student: str | None = None
    context: TeacherContext = TeacherContext.aligned
    kinds: list[CallKind] | None = None
    row_tokens: int = Field(4096, ge=16)
    rows_per_batch: int = Field(1, ge=1)
    topk: int = Field(0, ge=0)
    topk_dir: str = "agentmem_topk"
    path: AttentionPath = AttentionPath.fast
    # shared_prefix: the same scores (exact up to float round-off, tested), a group's prefix computed once
    packing: Packing = Packing.shared_prefix
    teacher_truncation: TeacherTruncation = TeacherTruncation.error
    dtype: DType = DType.float32
    temperature: float = Field(1.0, gt=0)
    # context privileged: a JSONL of {task_id, answers, text} for episodes stored without privileged context
    privileged_file: str | None = None

    @field_validator("kinds", mode="before")
    @classmethod
    def _kind_names(cls, value: Any) -> Any:
        return kind_names(value)

    @model_validator(mode="after")
    def _privileged_file(self) -> ScoreConfig:
        if self.privileged_file is not None and self.context is not TeacherContext.privileged:
            raise ValueError("--privileged-file is the privileged context's: give --context privileged")
        return self

    @model_validator(mode="before")
    @classmethod
    def _legacy(cls, data: Any) -> Any:
        if isinstance(data, dict) and "truncate" in data:  # runs stored before the field was renamed
            data = dict(data)
            data["teacher_truncation"] = data.pop("truncate")
            data.pop("teacher_name", None)
        return data


class DistillConfig(Frozen):
    """Training from stored calls: the objective is a weighted sum of terms (``kd_weight`` ×
    divergence to the teacher, ``rl_weight`` × clipped policy gradient on the final reward,
    ``ce_weight`` × cross-entropy on action tokens, ``anchor_weight`` × KL to the frozen starting
    student). ``run_ids`` may be empty only inside a ``TrainConfig`` (each round fills it). ``target``
    and the ``alpha_*``/``prob_floor`` options choose DemoPSD's barycenter target, ``jsd_clip`` OPSD's
    per-token clip of the divergence (docs/methods.md)."""

    run_ids: list[str] = Field(default_factory=list)
    student: str = "default"
    teacher: str | None = "default"
    teacher_source: TeacherSourceKind = TeacherSourceKind.model
    context: TeacherContext = TeacherContext.aligned
    # call kinds the teacher scores in the aligned context whatever ``context`` is: e.g. ``[answer]`` with
    # ``persistent`` measures the persistent context on update calls alone (teacher_source=model only)
    aligned_kinds: list[CallKind] | None = None
    loss: Divergence = Divergence.reverse_kl
    beta: float = Field(0.5, ge=0, le=1)
    temperature: float = Field(1.0, gt=0)
    rl: RLKind = RLKind.grpo
    kd_weight: float = Field(1.0, ge=0)
    rl_weight: float = Field(1.0, ge=0)
    ce_weight: float = Field(0.0, ge=0)
    anchor_weight: float = Field(0.0, ge=0)
    # weights of loss terms that installed packages register (entry-point group agentmem.loss_terms), by name
    loss_terms: dict[str, NonNegativeFloat] = Field(default_factory=dict)
    normalize_std: bool = False
    clip_eps: float = Field(0.2, ge=0)
    weighting: Weighting = Weighting.token
    steps: int = Field(10, ge=1)
    invocations_per_step: int = Field(8, ge=1)
    row_tokens: int = Field(4096, ge=16)
    lr: float = Field(1e-5, gt=0)
    # The learning-rate schedule over the global step ``schedule_offset + step`` of ``schedule_steps`` steps
    # (default: this job's ``steps``); ``agentmem train`` sets offset and length so that one schedule spans
    # every round.
    warmup_steps: int = Field(0, ge=0)
    schedule: LrSchedule = LrSchedule.constant
    min_lr_ratio: float = Field(0.1, ge=0, le=1)
    schedule_offset: int = Field(0, ge=0)
    schedule_steps: int | None = Field(None, ge=1)
    # Start AdamW from the state saved in the student's checkpoint folder (the previous round's), so its
    # moments carry across rounds instead of restarting each round.
    carry_optimizer: bool = False
    reward: RewardKind = RewardKind.f1
    # Load the frozen starting student to log KL(student || start) every step (``train_steps.metrics``).
    monitor_start_kl: bool = False
    weight_decay: float = Field(0.0, ge=0)
    max_grad_norm: float = Field(1.0, gt=0)
    seed: int = 0
    out: str = "checkpoints"
    save_every: int | None = Field(None, ge=1)
    kinds: list[CallKind] | None = None
    path: AttentionPath = AttentionPath.fast
    packing: Packing = Packing.segments
    oversize: Oversize = Oversize.error
    teacher_truncation: TeacherTruncation = TeacherTruncation.error
    dtype: DType = DType.float32
    # The distillation target (DemoPSD's barycenter) and OPSD's per-token clip; docs/methods.md.
    target: DistillTarget = DistillTarget.teacher
    alpha_tau: float = Field(0.1, gt=0)
    alpha_topk: int = Field(20, ge=1)
    alpha_min: float = Field(0.0, ge=0, le=1)
    alpha_max: float = Field(1.0, ge=0, le=1)
    alpha_ema: float = Field(0.0, ge=0, lt=1)
    prob_floor: float = Field(0.0, ge=0, lt=1)
    jsd_clip: float | None = Field(None, gt=0)
    # Pseudo self-distillation: whose samples the privileged teacher scores, and the off-policy share of mixed.
    psd: PsdMode = PsdMode.none
    psd_mix: float = Field(0.5, ge=0, le=1)

    @field_validator("kinds", "aligned_kinds", mode="before")
    @classmethod
    def _kind_names(cls, value: Any) -> Any:
        return kind_names(value)

    @field_validator("psd")
    @classmethod
    def _psd_is_privileged(cls, value: PsdMode, info: ValidationInfo) -> PsdMode:
        if value is PsdMode.none:
            return value
        if info.data.get("context") is not TeacherContext.privileged:
            raise ValueError(f"psd={value.value} distils from the privileged teacher: set context=privileged "
                             "(--context privileged)")
        if not (info.data.get("teacher") and info.data.get("kd_weight")):
            raise ValueError(f"psd={value.value} needs a teacher and kd_weight > 0")
        if value is PsdMode.mixed and info.data.get("invocations_per_step", 2) < 2:
            raise ValueError("psd=mixed draws calls of both kinds every step: invocations_per_step must be >= 2")
        return value

    @field_validator("psd_mix")
    @classmethod
    def _mixed_only(cls, value: float, info: ValidationInfo) -> float:
        if info.data.get("psd") is not PsdMode.mixed and value != cls.model_fields["psd_mix"].default:
            raise ValueError("psd_mix weights the off-policy loss of psd=mixed: set psd=mixed (--psd mixed) or "
                             "leave it at its default")
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

    @field_validator("alpha_tau", "alpha_topk", "alpha_min", "alpha_max", "alpha_ema", "prob_floor")
    @classmethod
    def _barycenter_only(cls, value: Any, info: ValidationInfo) -> Any:
        field_name = str(info.field_name)
        if info.data.get("target") is not DistillTarget.barycenter and value != cls.model_fields[field_name].default:
            raise ValueError(f"{info.field_name} is an option of the barycenter target: set target=barycenter "
                             "(--target barycenter) or leave it at its default")
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


class ReplayConfig(Frozen):
    """ReOPD's replay rollout (``agentmem rollout --replay-from RUN``): for every episode of the stored
    ``teacher_run`` one step ``t`` is drawn with probability ``kappa**t / sum_s kappa**s`` (seeded by
    ``seed``), and the student ``model`` samples that call ``group_size`` times from the teacher's stored
    prompt ids (which hold the teacher's memory), with the teacher run's token limits. No environment is
    stepped. Stored as a run of kind ``replay``; its calls carry no reward."""

    teacher_run: str
    model: str = "default"
    backend: BackendKind = BackendKind.transformers
    dtype: DType = DType.float32
    group_size: int = Field(1, ge=1)
    kappa: float = Field(0.6, gt=0)
    seed: int = Field(0, ge=0)
    temperature: float = Field(1.0, ge=0)
    top_p: float = Field(1.0, gt=0, le=1)
    max_batch: int = Field(8, ge=1)


# LoRA targets of llama-style models (Llama, Qwen2, SmolLM2): every attention and MLP projection.
LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
KIND_ALIASES = {"update": InvocationKind.memory_update.value}
# the kinds of calls recorded by ``agentmem serve`` that name no kind of their own (``X-Agentmem-Kind``)
SERVE_KINDS = ("chat", "completion")


def kind_names(value: Any) -> Any:
    """``--kinds``: a comma-separated string or a list of call kinds (``update`` = ``memory_update``). Which
    kinds exist is the memory policies' to say: the jobs check them against the registry
    (``agentmem.agent.registry.check_kinds``), before any model loads."""
    if isinstance(value, str):
        value = [v.strip() for v in value.split(",") if v.strip()]
    if not isinstance(value, list):
        return value
    if not value:
        raise ValueError("give at least one call kind (or none of the option: every kind)")
    return [KIND_ALIASES.get(v, v) if isinstance(v, str) else v for v in value]


class SftConfig(Frozen):
    """Supervised fine-tuning on stored calls (``agentmem sft``): cross-entropy on the action tokens only,
    on the distill job's rebuild -> pack -> forward path (``distill_config`` gives the ``DistillConfig``
    the ``Trainer`` runs: the cross-entropy term alone, no teacher, no RL). The calls are those of
    ``run_ids`` (oracle runs, a teacher's runs or the student's own), of ``kinds`` (``update`` is an alias
    of ``memory_update``; a comma-separated string is accepted), of episodes with ``f1 >= min_f1`` when
    given. ``lora_rank``: train LoRA adapters on ``lora_targets`` instead of every weight (the saved
    checkpoints hold the merged weights)."""

    run_ids: list[str] = Field(min_length=1)
    student: str = "default"
    min_f1: float | None = Field(None, ge=0, le=1)
    kinds: list[CallKind] | None = None
    lora_rank: int | None = Field(None, ge=1)
    lora_alpha: float = Field(16.0, gt=0)
    lora_dropout: float = Field(0.0, ge=0, lt=1)
    lora_targets: list[str] = Field(default_factory=lambda: list(LORA_TARGETS), min_length=1)
    steps: int = Field(10, ge=1)
    invocations_per_step: int = Field(8, ge=1)
    row_tokens: int = Field(4096, ge=16)
    lr: float = Field(1e-5, gt=0)
    warmup_steps: int = Field(0, ge=0)
    schedule: LrSchedule = LrSchedule.constant
    min_lr_ratio: float = Field(0.1, ge=0, le=1)
    weight_decay: float = Field(0.0, ge=0)
    max_grad_norm: float = Field(1.0, gt=0)
    seed: int = 0
    out: str = "checkpoints"
    save_every: int | None = Field(None, ge=1)
    weighting: Weighting = Weighting.token
    path: AttentionPath = AttentionPath.fast
    packing: Packing = Packing.segments
    oversize: Oversize = Oversize.error
    dtype: DType = DType.float32
    anchor_weight: float = Field(0.0, ge=0)  # x KL(student || frozen starting student), as in distill

    @field_validator("kinds", mode="before")
    @classmethod
    def _kind_names(cls, value: Any) -> Any:
        return kind_names(value)

    def distill_config(self) -> DistillConfig:
        """The ``DistillConfig`` of the same training: cross-entropy (weight 1) on the action tokens only
        (plus the anchor term when ``anchor_weight > 0``)."""
        return DistillConfig(
            run_ids=self.run_ids, student=self.student, teacher=None, rl=RLKind.none, kd_weight=0.0,
            rl_weight=0.0, ce_weight=1.0, weighting=self.weighting, steps=self.steps,
            invocations_per_step=self.invocations_per_step, row_tokens=self.row_tokens, lr=self.lr,
            warmup_steps=self.warmup_steps, schedule=self.schedule, min_lr_ratio=self.min_lr_ratio,
            weight_decay=self.weight_decay, max_grad_norm=self.max_grad_norm, seed=self.seed, out=self.out,
            save_every=self.save_every, kinds=self.kinds, path=self.path, packing=self.packing,
            oversize=self.oversize, dtype=self.dtype, anchor_weight=self.anchor_weight)


def _train_rollout() -> RolloutConfig:
    return RolloutConfig(env="synthetic", env_knobs={"context_tokens": 384, "distractors": 2, "hops": 1},
                         episodes=4, group_size=4, chunk_tokens=192,
                         agent=AgentConfig(memory_tokens=48, answer_max_new_tokens=16, temperature=1.0))


def _train_distill() -> DistillConfig:
    # privileged: the same base model sees the gold answer and evidence, so one small model runs the loop;
    # skip: a call over the row budget is left out and counted, never cut (train_steps.metrics).
    # the stable recipe (docs/learning.md): fresh rollouts every 2 steps, one warmup + cosine schedule over
    # all rounds, AdamW's moments carried across rounds, a reward with variance for a small model
    return DistillConfig(context=TeacherContext.privileged, steps=2, oversize=Oversize.skip,
                         teacher_truncation=TeacherTruncation.left, packing=Packing.shared_prefix, lr=1e-5,
                         warmup_steps=1, schedule=LrSchedule.cosine, carry_optimizer=True,
                         reward=RewardKind.max_f1_sub_em, monitor_start_kl=True)


class TrainConfig(Frozen):
    """The on-policy loop: ``rounds`` × (rollout with the current checkpoint, ``distill.steps`` distill
    steps on that rollout). Each round sets the rollout's model and seed and the distill's student,
    run ids and seed; everything else is taken as given."""

    rounds: int = Field(2, ge=1)
    seed: int = 0
    rollout: RolloutConfig = Field(default_factory=_train_rollout)
    distill: DistillConfig = Field(default_factory=_train_distill)
    # SFT before round 1 (its run_ids: an oracle or teacher run); its last checkpoint starts round 1
    warm_start: SftConfig | None = None
    # the teacher is checked before any distillation: a greedy eval of it on ``teacher_check_episodes``
    # tasks of the rollout's environment (held-out seed); above ``max_teacher_empty`` end-of-sequence-only
    # outputs on any call kind the loop refuses it. 0 episodes: no check.
    teacher_check_episodes: int = Field(8, ge=0)
    max_teacher_empty: float = Field(0.1, ge=0, le=1)
    # ... and above ``max_teacher_forgot`` of its memory updates made once a fact was read writing ``(empty)``
    max_teacher_forgot: float = Field(0.5, ge=0, le=1)

    @model_validator(mode="after")
    def _run_ids_per_round(self) -> TrainConfig:
        if self.distill.run_ids:
            raise ValueError("distill.run_ids is set by each round of the loop: leave it empty")
        return self

    def round_configs(self, round_index: int, policy_id: str) -> tuple[RolloutConfig, DistillConfig]:
        """Round ``round_index``'s rollout (the current policy, seed ``seed + round``) and distill (that
        policy as the student; its part of one learning-rate schedule over every round)."""
        seed = self.seed + round_index
        rollout = self.rollout.model_copy(update={"model": policy_id, "seed": seed})
        steps = self.distill.steps
        # round 1 starts AdamW fresh (its student is the base or warm-start model), later rounds carry it
        return rollout, self.distill.model_copy(update={
            "student": policy_id, "seed": seed, "schedule_offset": round_index * steps,
            "schedule_steps": self.rounds * steps, "carry_optimizer": self.distill.carry_optimizer and round_index > 0})
