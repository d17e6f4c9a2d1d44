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


class TeacherCentering(Choice):
    """Which shared part of the teacher term's push the student is spared: ``none`` (the plain divergence), or,
    at each call's first output position, the push (the divergence's gradient on the student's logits) minus its
    weighted mean over the step's calls of the same group, like GRPO's group baseline for the reward. The groups:
    ``first_token``, the call kind; ``first_token_memory``, the call kind and whether the call's memory was empty
    (the calls that face one decision: what to keep of a chunk read into nothing, or how to rewrite what is
    held). The teacher then moves only how the calls of a group differ (e.g. writing ``(empty)`` on a distractor
    read and the fact on an evidence read), not what they share (writing ``(empty)`` on any first read)."""

    none = "none"
    first_token = "first_token"
    first_token_memory = "first_token_memory"


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
    # a field's docstring is its description: the help of its CLI option (``cli.config_options``)
    model_config = ConfigDict(frozen=True, extra="forbid", use_enum_values=False, use_attribute_docstrings=True)


class AgentConfig(Frozen):
    """How the agent reads: memory budget, generation limits, sampling, memory policy, prompt layout.

    ``prompt_layout`` defaults to ``chunk-first``; a stored config that has no such field (a run made
    before it existed) reads as ``memory-first``, the layout that run used (``AgentConfig.stored``)."""

    @classmethod
    def stored(cls, data: dict) -> AgentConfig:
        return cls.model_validate({"prompt_layout": PromptLayout.memory_first.value, **data})

    memory_tokens: int = Field(128, ge=1)
    """Memory budget in tokens (max new tokens of an update)."""
    answer_max_new_tokens: int = Field(32, ge=1)
    """Max new tokens of the answer call."""
    max_chunks: int | None = Field(None, ge=1)
    """Read at most this many chunks (episode truncated)."""
    temperature: float = Field(1.0, ge=0)
    """Sampling temperature; 0 = greedy."""
    top_p: float = Field(1.0, gt=0, le=1)
    """Nucleus sampling threshold."""
    memory_policy: str = "overwrite"
    """Memory policy (registered name): overwrite (MemAgent), log (PRO-LONG), events (MemPrism), routed
    (Router-Mem), teacher (AMD/DuoMem memories); see docs/memory.md."""
    # the memory policy's own options (``--memory-option KEY=VALUE``), validated by the policy's factory
    memory_options: dict[str, Any] = Field(default_factory=dict)
    """Memory policy option KEY=VALUE, e.g. condition=windowed-log, threshold=0.5; each policy's options are
    in docs/memory.md."""
    prompt_layout: PromptLayout = PromptLayout.chunk_first
    """Update prompt order: chunk-first (question, chunk, memory: a task's samples share the prefix) or
    memory-first (MemAgent's order)."""
    max_batch: int = Field(8, ge=1)
    """Calls per backend batch (across episodes)."""
    seed: int = Field(0, ge=0)
    """Sampling seed (round r samples with seed * 1000003 + r); on the command line it follows --seed unless
    given."""


class RolloutConfig(Frozen):
    """Everything a rollout depends on; stored with the run so ``--resume`` needs only the run id."""

    @classmethod
    def stored(cls, data: dict) -> RolloutConfig:
        """A config read back from a run row (see ``AgentConfig.stored`` for the one default that differs)."""
        data = dict(data)
        data["agent"] = AgentConfig.stored(data.get("agent") or {})
        return cls.model_validate(data)

    env: str = "synthetic"
    """Environment."""
    data: str | None = None
    """Data file in the benchmark's official JSON format."""
    env_knobs: dict[str, Any] = Field(default_factory=dict)
    """Environment knob KEY=VALUE, e.g. hops=3, context_tokens=4096, docs=20."""
    model: str = "default"
    """Model folder, checkpoint id, or 'default' (SmolLM2-135M-Instruct, prepared on first use)."""
    policy: PolicySource = PolicySource.model  # oracle: ``model`` gives only the tokenizer and chat template
    """Who writes the outputs: the model (sampled, with log-probs) or the oracle (scripted from the task's
    evidence and gold answer: no model, no log-probs; --model gives only the tokenizer and chat template)."""
    backend: BackendKind = BackendKind.transformers
    """Generation backend (openai: a client of an `agentmem serve` server at --base-url serving --model)."""
    base_url: str | None = None  # backend openai: the server's /v1 URL (``agentmem serve``)
    """With --backend openai: the server's URL, e.g. http://127.0.0.1:8000/v1."""
    # fp32 by default: on CPU it is faster end to end for long prompts (prefill dominates), and the stored
    # sampler log-probs then match the fp32 training recompute (bf16 differs by ~0.03 on average).
    dtype: DType = DType.float32
    """Weights dtype for the transformers backend; auto (command line only): the faster of float32 and
    bfloat16 measured on this CPU (bfloat16 only where it has avx512_bf16/amx_bf16), printed and stored in the
    run config."""
    episodes: int = Field(8, ge=1)
    """Number of tasks."""
    group_size: int = Field(1, ge=1)
    """Episodes sampled per task (for group-normalised RL)."""
    seed: int = Field(0, ge=0)
    """Seed for task order and sampling."""
    chunk_tokens: int = Field(512, ge=16)
    """Tokens per chunk the agent reads per call."""
    agent: AgentConfig = Field(default_factory=AgentConfig)
    # privileged: every call is sampled with the episode's privileged message (gold answer, evidence) spliced
    # before its prompt, stored apart from the student-visible prompt (PSD's off-policy samples)
    context: SamplingContext = SamplingContext.aligned
    """Prompt the model samples from: aligned (the task prompt) or privileged (the episode's gold answer and
    evidence as a system message before every prompt, stored apart: PSD's off-policy samples, `distill --psd
    off_policy`)."""

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
    """Number of tasks (one greedy episode each)."""
    seed: int = Field(HELD_OUT_SEED, ge=0)
    """Seed for task selection. The default differs from rollout's (0) so that synthetic tasks are ones
    training never saw; data files are only reordered by it."""
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
    """Rollout run id(s) to score."""
    teacher: str = "default"
    """Teacher: model folder, checkpoint id or 'default'."""
    student: str | None = None
    """Student model; adds the per-token reverse KL KL(student_T || teacher_T) at --temperature."""
    context: TeacherContext = TeacherContext.aligned
    """Teacher context: aligned (the student's own state) | persistent (earlier calls concatenated as stored)
    | persistent_chat (the episode as one multi-turn chat) | privileged."""
    kinds: list[CallKind] | None = None
    """Only these call kinds (e.g. memory_update, answer, or a memory policy's own kinds). Default: all."""
    row_tokens: int = Field(4096, ge=16)
    """Tokens per packed row (hard cap)."""
    rows_per_batch: int = Field(1, ge=1)
    """Packed rows per forward pass."""
    topk: int = Field(0, ge=0)
    """Also write the teacher's top-K log-probs to safetensors shards."""
    topk_dir: str = "agentmem_topk"
    """Folder for the top-K shards."""
    path: AttentionPath = AttentionPath.fast
    """Packed attention path: fast (per-segment attention, flash-attn varlen on CUDA) or reference (a 4-D
    block mask)."""
    # shared_prefix: the same scores (exact up to float round-off, tested), a group's prefix computed once
    packing: Packing = Packing.shared_prefix
    """Row layout: segments (each call whole) or shared_prefix (a (run, task, step) group's common prompt
    prefix placed and computed once; exact)."""
    teacher_truncation: TeacherTruncation = TeacherTruncation.error
    """A teacher context longer than --row-tokens: error, or left (cut from the left; counted and shown)."""
    dtype: DType = DType.float32
    """Teacher/student weights dtype."""
    temperature: float = Field(1.0, gt=0)
    """Temperature of both distributions (stored per row)."""
    # context privileged: a JSONL of {task_id, answers, text} for episodes stored without privileged context
    privileged_file: str | None = None
    """With --context privileged: a JSONL of {"task_id", "answers", "text"} giving the privileged context of
    episodes stored without one (e.g. an `agentmem serve` run)."""

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


def _mixed_over_float32(value: bool, info: ValidationInfo) -> bool:
    dtype = info.data.get("dtype")
    if value and dtype is not None and DType(dtype) is not DType.float32:
        raise ValueError(f"mixed_precision keeps float32 weights and runs their decoder in bfloat16: it needs "
                         f"dtype=float32, got dtype={DType(dtype).value} (give one of the two)")
    return value


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
    """Weight of the distillation term."""
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
        return _mixed_over_float32(value, info)

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
    """ReOPD: decay of the branch-step distribution P(t) ∝ kappa^t (with --replay-from)."""
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
    """Run id(s) whose stored calls to train on: oracle runs, a teacher's runs or the student's own."""
    student: str = "default"
    """Student: model folder, checkpoint id or 'default'."""
    min_f1: float | None = Field(None, ge=0, le=1)
    """Train only on calls of episodes with F1 >= this (e.g. a student's own successful episodes)."""
    kinds: list[CallKind] | None = None
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
    # the defaults are the warm-start recipe measured in docs/learning.md (16 steps at 5e-5, one warmup step,
    # cosine): at the old 10 steps at 1e-5 (constant) the README's path learned to write `(empty)` and gained nothing
    steps: int = Field(16, ge=1)
    """Optimizer steps in all (on --resume, the stored value unless given)."""
    invocations_per_step: int = Field(8, ge=1)
    """Stored calls per optimizer step."""
    row_tokens: int = Field(4096, ge=16)
    """Tokens per packed row."""
    lr: float = Field(5e-5, gt=0)
    """Peak AdamW learning rate."""
    warmup_steps: int = Field(1, ge=0)
    """Linear warmup steps (step s at lr x (s+1)/(warmup+1))."""
    schedule: LrSchedule = LrSchedule.cosine
    """Learning rate after warmup: constant, or cosine decay to --min-lr-ratio x lr at the last step."""
    min_lr_ratio: float = Field(0.1, ge=0, le=1)
    """Cosine schedule: the last step's learning rate as a share of lr."""
    weight_decay: float = Field(0.0, ge=0)
    """AdamW weight decay."""
    max_grad_norm: float = Field(1.0, gt=0)
    """Gradient norm clip."""
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
    path: AttentionPath = AttentionPath.fast
    """Packed attention path: fast (per-segment attention, flash-attn varlen on CUDA) or reference (a 4-D
    block mask)."""
    packing: Packing = Packing.segments
    """Row layout: segments (each call whole) or shared_prefix (a (run, task, step) group's common prompt
    prefix placed and computed once; exact)."""
    oversize: Oversize = Oversize.error
    """A stored call longer than --row-tokens: error, or skip (left out and counted). Never cut."""
    dtype: DType = DType.float32
    """Weights dtype of training (bf16 is faster on most CPUs)."""
    mixed_precision: bool = False
    """The student's (and the anchor reference's) decoder under bfloat16 autocast, the weights, gradients,
    AdamW state and the output head in float32 (as in distill). Needs --train-dtype float32."""
    anchor_weight: float = Field(0.0, ge=0)  # x KL(student || frozen starting student), as in distill
    """Weight of KL(student || frozen starting student), OPTD's frozen anchor against drift (the starting
    weights, without LoRA adapters)."""
    carry_optimizer: bool = False
    """Start AdamW from the state saved in the student's checkpoint folder (an earlier sft's or distill's),
    when it kept one: its moments and step count go on, so the first step is not fresh AdamW's sign-like step
    of size lr on every weight. Full-parameter training only (not with --lora-rank)."""
    carry_first_moment: bool = True
    """With --carry-optimizer (without it, moot): also carry AdamW's first moment (its running mean of the
    earlier job's gradients). --no-carry-first-moment starts it at zero and keeps the second moment and step
    count: the carried state sets each weight's step size but pushes along no earlier direction."""
    # privileged: the model learns the stored outputs under the privileged message (gold answer and evidence)
    # spliced before each prompt, exactly what the ``privileged`` teacher context reads: a privileged teacher
    # fine-tuned in its own context. Never a student's recipe: a student reads only its own prompt
    context: SamplingContext = SamplingContext.aligned
    """Prompt the model is trained under: aligned (the stored prompt, what a student reads) or privileged (the
    episode's gold answer and evidence as a system message before every prompt: the SFT of a privileged
    teacher for `distill --context privileged`, which reads the same splice)."""

    @field_validator("kinds", mode="before")
    @classmethod
    def _kind_names(cls, value: Any) -> Any:
        return kind_names(value)

    @field_validator("mixed_precision")
    @classmethod
    def _mixed_over_float32(cls, value: bool, info: ValidationInfo) -> bool:
        return _mixed_over_float32(value, info)

    @field_validator("carry_optimizer")
    @classmethod
    def _carry_full_parameters(cls, value: bool, info: ValidationInfo) -> bool:
        if value and info.data.get("lora_rank") is not None:
            raise ValueError("carry_optimizer restores a full-parameter AdamW state: it cannot start LoRA adapters "
                             "(leave out --lora-rank or --carry-optimizer)")
        return value

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
            oversize=self.oversize, dtype=self.dtype, mixed_precision=self.mixed_precision,
            anchor_weight=self.anchor_weight,
            carry_optimizer=self.carry_optimizer, carry_first_moment=self.carry_first_moment)


class WarmStartConfig(SftConfig):
    """``TrainConfig.warm_start``: an SFT before round 1 with the recipe's defaults (docs/learning.md: 16
    steps at 5e-5, one warmup step, cosine). Stored as an ``SftConfig``'s fields."""

    steps: int = Field(16, ge=1)
    """Warm-start SFT steps."""
    lr: float = Field(5e-5, gt=0)
    """Peak learning rate of the warm start."""
    warmup_steps: int = Field(1, ge=0)
    """Linear warmup steps of the warm start."""
    schedule: LrSchedule = LrSchedule.cosine
    """Learning rate after warmup: cosine decay to --min-lr-ratio x lr at the last step, or constant."""
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


def _train_rollout() -> RolloutConfig:
    return RolloutConfig(env="synthetic", env_knobs={"context_tokens": 384, "distractors": 2, "hops": 1},
                         episodes=4, group_size=4, chunk_tokens=192,
                         agent=AgentConfig(memory_tokens=48, answer_max_new_tokens=16, temperature=1.0))


def _train_distill() -> DistillConfig:
    # privileged: the same base model sees the gold answer and evidence, so one small model runs the loop;
    # skip: a call over the row budget is left out and counted, never cut (train_steps.metrics).
    # the stable recipe (docs/learning.md): fresh rollouts every 2 steps, one warmup + cosine schedule over
    # all rounds, AdamW's moments carried across rounds (round 1 takes the warm start's scale without its first
    # moment: the SFT's momentum is another objective's direction), a reward with variance for a small model; forward
    # KL at 5e-5 (reverse KL drove every memory update to `(empty)` in one step; at 1e-5 the student barely
    # moved from its warm start)
    return DistillConfig(context=TeacherContext.privileged, steps=2, oversize=Oversize.skip,
                         teacher_truncation=TeacherTruncation.left, packing=Packing.shared_prefix, lr=5e-5,
                         loss=Divergence.forward_kl,
                         warmup_steps=1, schedule=LrSchedule.cosine, carry_optimizer=True,
                         carry_first_moment=False,
                         reward=RewardKind.max_f1_sub_em, monitor_start_kl=True)


class TrainConfig(Frozen):
    """The on-policy loop: ``rounds`` × (rollout with the current checkpoint, ``distill.steps`` distill
    steps on that rollout). Each round sets the rollout's model and seed and the distill's student,
    run ids and seed; everything else is taken as given."""

    rounds: int = Field(2, ge=1)
    """Rollout + distill rounds."""
    seed: int = 0
    """Seed (rollout tasks, sampling, data order); round r uses seed + r."""
    rollout: RolloutConfig = Field(default_factory=_train_rollout)
    distill: DistillConfig = Field(default_factory=_train_distill)
    # SFT before round 1 (its run_ids: an oracle or teacher run); its last checkpoint starts round 1
    warm_start: WarmStartConfig | None = None
    # the teacher is checked before any distillation: a greedy eval of it on ``teacher_check_episodes``
    # tasks of the rollout's environment (held-out seed); above ``max_teacher_empty`` end-of-sequence-only
    # outputs on any call kind the loop refuses it. 0 episodes: no check.
    teacher_check_episodes: int = Field(8, ge=0)
    """Validate the teacher first on this many held-out greedy episodes; refuse it when a call kind's
    end-of-sequence-only share is over --max-teacher-empty (0: no check)."""
    max_teacher_empty: float = Field(0.1, ge=0, le=1)
    """Largest end-of-sequence-only share the teacher may have on any call kind."""
    max_teacher_forgot: float = Field(0.5, ge=0, le=1)
    """Largest share of the teacher's memory updates, made once a fact was read, that write an empty memory
    ((empty)): a teacher over it would teach the student to drop what it read."""

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
        # every round carries AdamW from its student's folder when that kept a state: from round 2 on the previous
        # round's; in round 1 the warm start's or --init's (a base model folder keeps none: a fresh AdamW, whose
        # first step moves every weight by about lr; carrying the warm start's took the first step's KL to the
        # start from 0.24 to 0.015 in the learning benchmark, docs/learning.md)
        # carry_first_moment concerns round 1's start only (the warm start's or --init's moments, another job's
        # direction); from round 2 on the moments carried are this loop's own
        first_moment = self.distill.carry_first_moment or round_index > 0
        return rollout, self.distill.model_copy(update={
            "student": policy_id, "seed": seed, "schedule_offset": round_index * steps,
            "schedule_steps": self.rounds * steps, "carry_first_moment": first_moment})
