"""The Enums of every fixed choice of the configs: a ``str`` Enum, so stored JSON keeps plain strings and old
runs load."""

from __future__ import annotations

import enum

__all__ = [
    "AttentionPath", "BackendKind", "Choice", "DType", "Device", "DistillTarget", "Divergence", "KdForm",
    "LrSchedule", "Oversize", "Packing", "PlotBy", "PolicySource", "PromptLayout", "PsdMode", "RLKind", "RewardKind",
    "RoundData", "TeacherCentering", "TeacherSourceKind", "TeacherTruncation", "Weighting",
]


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


class KdForm(Choice):
    """How the teacher enters an objective that also has the RL term: ``additive``, its own divergence term
    beside the policy gradient (``kd_weight`` x divergence + ``rl_weight`` x policy gradient); ``advantage``, the
    RL-plus-distillation form of slime and tinker-cookbook: no divergence term, each sampled token's advantage
    minus ``kd_weight`` x (log p_sampler(a) - log p_teacher(a)), so the teacher acts as a per-token reward."""

    additive = "additive"
    advantage = "advantage"


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


class RoundData(Choice):
    """What each round of ``agentmem train`` trains on: the ``student``'s own samples of the round's tasks
    (on-policy: distillation, RL), the ``teacher``'s samples of them under its context (SeqKD), or the
    ``oracle``'s calls on them (SFT continued)."""

    student = "student"
    teacher = "teacher"
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
