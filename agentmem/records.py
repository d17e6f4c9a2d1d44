"""Typed records shared by every layer: what crosses a module boundary is one of these.

Invariants:
- token ids are ``np.int32`` arrays and log-probs ``np.float32`` arrays (1-D, C-contiguous), whatever
  was passed in (lists, other dtypes); they serialise to JSON as plain lists;
- ids are strings (uuid4 hex) chosen by the writer, so records can be built before they are stored and
  re-runs can use deterministic ids as idempotency keys;
- records are frozen: a changed record is a new record (``model_copy(update=...)``).
"""

from __future__ import annotations

import enum
import uuid
from datetime import datetime, timezone
from typing import Annotated, Any

import numpy as np
from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, PlainSerializer, model_validator


def new_id() -> str:
    return uuid.uuid4().hex


def utcnow() -> datetime:
    return datetime.now(timezone.utc)


def _as_array(dtype: type) -> Any:
    def convert(value: Any) -> np.ndarray:
        arr = np.ascontiguousarray(np.asarray(value, dtype=dtype))
        if arr.ndim != 1:
            raise ValueError(f"expected a 1-D array, got shape {arr.shape}")
        return arr

    return convert


IntArray = Annotated[
    np.ndarray,
    BeforeValidator(_as_array(np.int32)),
    PlainSerializer(lambda a: a.tolist(), when_used="json"),
]
FloatArray = Annotated[
    np.ndarray,
    BeforeValidator(_as_array(np.float32)),
    PlainSerializer(lambda a: a.tolist(), when_used="json"),
]


class Record(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", arbitrary_types_allowed=True)


class InvocationKind(str, enum.Enum):
    """The call kinds of the built-in overwrite policy. ``Invocation.kind`` is an open string: a memory
    policy may add its own kinds (a search, a route or a view call); these two are compared by value."""

    memory_update = "memory_update"
    answer = "answer"

    def __str__(self) -> str:
        return self.value


def _kind(value: Any) -> str:
    kind = value.value if isinstance(value, enum.Enum) else value
    if not isinstance(kind, str) or not kind:
        raise ValueError(f"an invocation kind is a non-empty string, got {value!r}")
    return kind


CallKind = Annotated[str, BeforeValidator(_kind)]


class EpisodeStatus(str, enum.Enum):
    """running: not finished; answered: terminated normally; truncated: a budget was hit before the
    answer (calls or tokens); failed: an error (stored in ``Episode.error``)."""

    running = "running"
    answered = "answered"
    truncated = "truncated"
    failed = "failed"


class FinishReason(str, enum.Enum):
    stop = "stop"  # an end-of-sequence / stop token was sampled
    length = "length"  # max_new_tokens reached
    error = "error"


# what a prompt shows for a memory that holds nothing (``agentmem.agent.prompts`` renders it; the oracle writes
# it for an update with no fact read yet)
EMPTY_MEMORY = "(empty)"


def holds_nothing(memory: str) -> bool:
    """A memory that holds nothing: blank, or ``EMPTY_MEMORY`` as the prompt renders it."""
    return memory.strip() in ("", EMPTY_MEMORY)


class TeacherContext(str, enum.Enum):
    """What the teacher reads before a call's actions: the student's own state (``aligned``), every earlier
    call of the episode flattened as stored (``persistent``) or as one well-formed multi-turn chat
    (``persistent_chat``), or ``aligned`` plus privileged context: the gold answer and evidence
    (``privileged``), or on each memory update one line saying whether its chunk holds a fact about the
    question's entity (``hint``: ``replay.privileged.hint_ids``, no answer text)."""

    aligned = "aligned"
    persistent = "persistent"
    privileged = "privileged"
    persistent_chat = "persistent_chat"
    hint = "hint"


class SamplingContext(str, enum.Enum):
    """The prompt a call is sampled under (``rollout --context``, ``Invocation.sampled_context``): the
    student's own (``aligned``), or with the episode's privileged message spliced before it (``privileged``:
    PSD's off-policy samples), or each memory update's hint line (``hint``: a hint teacher's own prompt). A
    teacher reads a call under a ``TeacherContext``; the two share these values."""

    aligned = "aligned"
    privileged = "privileged"
    hint = "hint"


class RunKind(str, enum.Enum):
    rollout = "rollout"
    score = "score"
    distill = "distill"
    eval = "eval"
    train = "train"
    bench = "bench"
    sft = "sft"  # supervised fine-tuning on stored calls (cross-entropy on the action tokens)
    replay = "replay"  # ReOPD: the student's samples of single calls branched from a stored teacher run
    memories = "memories"  # `agentmem memories build`: workflow memories written from a run's episodes
    serve = "serve"  # `agentmem serve`: calls of outside agents recorded by the OpenAI-compatible server


class Run(Record):
    id: str = Field(default_factory=new_id)
    kind: RunKind
    config: dict[str, Any] = Field(default_factory=dict)
    status: str = "running"  # running | finished | failed | interrupted
    created_at: datetime = Field(default_factory=utcnow)
    finished_at: datetime | None = None
    error: str | None = None  # why a failed run failed (one line)
    pid: int | None = None  # the process running it, with host: tells a killed run from a live one
    host: str | None = None
    heartbeat_at: datetime | None = None  # refreshed as work completes


class Checkpoint(Record):
    """One model version. ``path`` is a local model folder or a hub name; ``parent_id`` is the checkpoint
    it was trained from (None for a base model)."""

    id: str = Field(default_factory=new_id)
    run_id: str | None = None
    parent_id: str | None = None
    step: int = 0
    path: str
    base_model: str
    created_at: datetime = Field(default_factory=utcnow)


class Fact(Record):
    """One piece of evidence as text (a supporting sentence, a dialogue turn) and ``chunk``, the index of
    the chunk after which a reader has read all of it. The oracle policy writes these into its memory."""

    text: str
    chunk: int = Field(ge=0)


class Task(Record):
    """One question over a long input, as an environment hands it to the agent.

    ``chunks`` are the pieces the agent reads one per call, in order; ``evidence`` is the supporting
    text (or ids) where the source has it; ``evidence_chunks`` the indices of chunks that contain it;
    ``facts`` the evidence as text with the chunk where each is complete, in reading order (empty where
    the source has no evidence annotation)."""

    task_id: str
    env: str
    question: str
    chunks: list[str]
    answers: list[str]
    evidence: list[str] = Field(default_factory=list)
    evidence_chunks: list[int] = Field(default_factory=list)
    facts: list[Fact] = Field(default_factory=list)
    category: str | None = None
    metadata: dict[str, Any] = Field(default_factory=dict)


class Episode(Record):
    """One agent trajectory on one task. ``sample_index`` numbers the G samples of a task in a group."""

    id: str = Field(default_factory=new_id)
    run_id: str
    env: str
    task_id: str
    sample_index: int = 0
    question: str
    gold_answers: list[str] = Field(default_factory=list)
    evidence: list[str] = Field(default_factory=list)
    category: str | None = None
    prediction: str | None = None
    reward: float | None = None
    f1: float | None = None
    em: float | None = None
    sub_em: float | None = None
    status: EpisodeStatus = EpisodeStatus.running
    stop_reason: str | None = None
    error: str | None = None
    n_chunks: int = 0
    created_at: datetime = Field(default_factory=utcnow)
    finished_at: datetime | None = None


class WorkflowMemory(Record):
    """A workflow memory (AMD, DuoMem): the strategy of one successful episode, abstracted from its
    specifics, written by ``writer`` (``oracle`` or a model reference) in build run ``build_run_id``.
    Provenance: the source run, episode and the invocations it was written from (``source_invocation_ids``,
    in step order); ``question`` is the source episode's (retrieval matches on it), ``f1`` its score."""

    id: str = Field(default_factory=new_id)
    build_run_id: str | None = None
    source_run_id: str
    source_episode_id: str
    source_invocation_ids: list[str] = Field(default_factory=list)
    writer: str
    env: str
    question: str
    text: str
    f1: float | None = None
    created_at: datetime = Field(default_factory=utcnow)


class Invocation(Record):
    """One model call, stored exactly as the sampler saw it.

    ``prompt_ids`` are the ids the backend consumed, ``output_ids`` the ids it sampled and
    ``output_logprobs[i]`` the sampler's log-prob of ``output_ids[i]`` under the temperature-scaled
    full-vocabulary distribution. Replay rebuilds from the ids, never from the text.

    ``role`` says who wrote the outputs: ``model`` (sampled; ``output_logprobs`` set) or ``oracle``
    (scripted by ``agentmem.agent.oracle`` from the task's evidence and gold answer; ``output_logprobs``
    is None: nothing sampled them, so they train by cross-entropy or distillation, never by RL).

    ``sampled_context`` says which prompt sampled the outputs: ``aligned`` (``prompt_ids`` as stored) or
    ``privileged`` (``privileged_ids + prompt_ids``: a privileged rollout, PSD's off-policy samples). The
    privileged ids are kept apart, so ``prompt_ids`` is always the student-visible prompt; the stored
    log-probs are then the privileged sampler's, not the student's. ``parent_invocation_id`` names the
    stored call a ReOPD replay call branched from (it was generated from that call's ``prompt_ids``)."""

    id: str = Field(default_factory=new_id)
    episode_id: str
    step: int
    kind: CallKind
    memory_policy: str = "overwrite"  # the memory policy that made the call (it owns ``kind``)
    policy_version: str | None = None
    prompt_ids: IntArray
    output_ids: IntArray
    output_logprobs: FloatArray | None
    role: str = "model"  # model | oracle
    prompt_text: str = ""
    output_text: str = ""
    memory_before: str = ""
    memory_after: str = ""
    chunk_text: str | None = None
    chunk_index: int | None = None
    finish_reason: FinishReason = FinishReason.stop
    temperature: float = 1.0
    latency_s: float = 0.0
    created_at: datetime = Field(default_factory=utcnow)
    sampled_context: SamplingContext = SamplingContext.aligned
    privileged_ids: IntArray | None = None  # the splice, set iff sampled_context is privileged or hint
    parent_invocation_id: str | None = None

    @model_validator(mode="after")
    def _sampled_prompt(self) -> Invocation:
        spliced = self.sampled_context is not SamplingContext.aligned
        if spliced != (self.privileged_ids is not None):
            raise ValueError("privileged_ids are stored exactly when sampled_context is privileged or hint")
        return self

    @property
    def sampled_prompt_ids(self) -> np.ndarray:
        """The ids the sampler consumed: ``privileged_ids + prompt_ids`` for a privileged call."""
        if self.privileged_ids is None:
            return self.prompt_ids
        return np.concatenate([self.privileged_ids, self.prompt_ids]).astype(np.int32)

    @property
    def prompt_tokens(self) -> int:
        return int(self.prompt_ids.shape[0])

    @property
    def output_tokens(self) -> int:
        return int(self.output_ids.shape[0])


class LogEntry(Record):
    """One entry of an episode log (the ``log`` memory policy, PRO-LONG), appended verbatim: ``seq`` is its
    position in the log, ``source`` what it is (``chunk`` or ``note``), ``invocation_id`` the call that
    appended it."""

    episode_id: str
    seq: int = Field(ge=0)
    source: str
    text: str
    invocation_id: str | None = None
    created_at: datetime = Field(default_factory=utcnow)


class TeacherScore(Record):
    """Teacher judgement of one invocation's sampled tokens under one teacher context.

    Arrays have one entry per output token: the teacher's log-prob of the sampled token, the
    full-vocabulary reverse KL(student || teacher) (empty when no student was given) and the teacher's
    entropy. ``topk_path`` names a safetensors shard with the top-K log-probs, when written."""

    id: str = Field(default_factory=new_id)
    run_id: str | None = None
    invocation_id: str
    teacher: str
    context: TeacherContext
    token_logprobs: FloatArray
    reverse_kl: FloatArray = Field(default_factory=lambda: np.zeros(0, np.float32))
    entropy: FloatArray = Field(default_factory=lambda: np.zeros(0, np.float32))
    topk_path: str | None = None
    topk_key: str | None = None
    temperature: float = 1.0  # both distributions of ``reverse_kl`` and ``entropy`` are taken at this T
    created_at: datetime = Field(default_factory=utcnow)


TERM_LOSS = "_loss"  # a loss term's value in a step's metrics is keyed ``{term name}_loss``


class TrainStep(Record):
    """One optimizer step. ``metrics`` holds every loss term that is on, built-in or a plugin's, as
    ``{name}_loss`` (its unweighted value; ``term_losses`` reads them), then the step's other numbers."""

    id: str = Field(default_factory=new_id)
    run_id: str
    step: int
    loss: float
    tokens: int = 0
    lr: float = 0.0
    seconds: float = 0.0
    metrics: dict[str, float] = Field(default_factory=dict)
    created_at: datetime = Field(default_factory=utcnow)

    @property
    def term_losses(self) -> dict[str, float]:
        """Each loss term's value this step, by term name, in the order the step reported them."""
        return {k.removesuffix(TERM_LOSS): v for k, v in self.metrics.items() if k.endswith(TERM_LOSS)}

    @property
    def kd_loss(self) -> float:
        """The distillation term's value (0 when it is off), read from ``metrics``."""
        return self.metrics.get("kd" + TERM_LOSS, 0.0)

    @property
    def rl_loss(self) -> float:
        """The policy-gradient term's value (0 when it is off), read from ``metrics``."""
        return self.metrics.get("rl" + TERM_LOSS, 0.0)


class EvalResult(Record):
    id: str = Field(default_factory=new_id)
    run_id: str
    checkpoint_id: str | None = None
    model: str
    env: str
    step: int | None = None
    n_episodes: int
    f1: float
    em: float
    sub_em: float
    f1_ci: tuple[float, float] = (0.0, 0.0)
    em_ci: tuple[float, float] = (0.0, 0.0)
    sub_em_ci: tuple[float, float] = (0.0, 0.0)
    metrics: dict[str, Any] = Field(default_factory=dict)
    created_at: datetime = Field(default_factory=utcnow)


class ServeCall(Record):
    """What a client sent with a call recorded by ``agentmem serve``: the chat ``messages`` and ``tools``
    (None for a completions call), the sampling parameters, what the client named (episode, task, kind),
    in gateway mode the upstream's prompt log-probs (NaN for the first prompt token), and whether the call is
    replayable (False: a provider returned text, tokenized locally, without the sampler's ids or log-probs)."""

    invocation_id: str
    messages: list[dict[str, Any]] | None = None
    tools: list[dict[str, Any]] | None = None
    sampling: dict[str, Any] = Field(default_factory=dict)
    client: dict[str, Any] = Field(default_factory=dict)
    prompt_logprobs: FloatArray | None = None
    replayable: bool = True  # False: the output ids were tokenized locally from a provider's text
    created_at: datetime = Field(default_factory=utcnow)
