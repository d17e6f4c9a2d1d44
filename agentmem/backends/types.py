"""The contract between the agent loop and any generation backend.

A backend takes a batch of prompts as token ids (built by the caller with the tokenizer's chat
template) and returns one ``Generation`` per prompt, in the same order. Backends never re-tokenise:
what the caller passes is exactly what the model consumes, and ``output_ids`` is exactly what the
model sampled, so replay can rebuild each invocation token for token.

Log-prob semantics shared by every backend (training recomputes the same quantity for importance
ratios): ``logprobs[i]`` is the log-probability of ``output_ids[i]`` under the temperature-scaled
distribution over the FULL vocabulary, ``log_softmax(logits / T)``. Top-p only restricts which
token may be sampled; it does not change the stored log-prob. For greedy decoding (T == 0) the
log-prob is taken at T = 1. A sampled end-of-sequence token is included in ``output_ids`` and
``logprobs`` (the policy chose to stop, and that choice is trained on).

The shaping options (``logit_bias``, ``repetition_penalty``, ``presence_penalty``, ``frequency_penalty``,
``top_k``, ``min_p``; all off by default, and agentmem's own rollouts never set them) and a ``grammar`` (constrained
decoding) change the distribution sampled from, and then the log-prob is that distribution's: ``log_softmax`` of the
logits with the tokens the grammar forbids removed, after the bias and penalties, divided by T, with the tokens top-k
and min-p cut removed (``backends.shaping``). Top-p keeps its
rule above: it restricts the draw without renormalising.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from agentmem.records import FinishReason

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase


@dataclass(frozen=True)
class SamplingParams:
    """``temperature == 0`` means greedy; ``seed`` makes sampling reproducible for the same batch. The
    shaping options follow vLLM's (and OpenAI's) names and meanings; their neutral values turn them off:
    ``top_k`` 0 (all tokens), ``min_p`` 0, ``repetition_penalty`` 1 (divides positive logits and multiplies
    negative ones of tokens in the prompt or output), ``presence_penalty`` and ``frequency_penalty`` 0
    (subtracted once per token present in the output, and per occurrence), ``logit_bias`` () (token id, bias)
    pairs added to the logits. ``grammar``: a constraint (an llguidance grammar, Lark syntax) that every output must
    follow: tokens it does not allow next are masked before any other option (``backends.shaping``)."""

    temperature: float = 1.0
    top_p: float = 1.0
    max_new_tokens: int = 128
    seed: int | None = None
    top_k: int = 0
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    logit_bias: tuple[tuple[int, float], ...] = ()
    grammar: str | None = None

    def __post_init__(self) -> None:
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {self.max_new_tokens}")
        if self.top_k < 0:
            raise ValueError(f"top_k must be >= 0 (0: off), got {self.top_k}")
        if not 0 <= self.min_p <= 1:
            raise ValueError(f"min_p must be in [0, 1], got {self.min_p}")
        if self.repetition_penalty <= 0:
            raise ValueError(f"repetition_penalty must be > 0, got {self.repetition_penalty}")

    @property
    def shaping(self) -> dict[str, Any]:
        """The shaping options that are on, by name (``logit_bias`` as ``{token id: bias}``): what a backend
        must apply, or refuse."""
        on = {"top_k": self.top_k, "min_p": self.min_p, "presence_penalty": self.presence_penalty,
              "frequency_penalty": self.frequency_penalty, "logit_bias": dict(self.logit_bias)}
        out = {k: v for k, v in on.items() if v}
        if self.repetition_penalty != 1:
            out["repetition_penalty"] = self.repetition_penalty
        return out

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


@dataclass(frozen=True)
class Generation:
    """One completion. ``output_ids`` and ``logprobs`` have the same length (``logprobs`` is None when no
    sampler wrote the ids: the oracle, ``agentmem.agent.oracle``); ``finish_reason`` is
    ``stop`` when the last token is an end-of-sequence token, ``length`` when ``max_new_tokens`` was
    reached. ``latency_s`` is the wall time from the start of the batched call until this sequence
    finished. ``top``: when the caller asked a backend that can (``TransformersBackend.generate(...,
    top_logprobs=k)``), per output token its ``k`` most likely tokens (id, log-prob), most likely first, from
    the same distribution as ``logprobs``."""

    output_ids: list[int]
    logprobs: list[float] | None
    finish_reason: FinishReason
    latency_s: float
    top: list[list[tuple[int, float]]] | None = None


class Backend(Protocol):
    name: str
    tokenizer: PreTrainedTokenizerBase

    def generate(self, prompts: list[list[int]], params: SamplingParams) -> list[Generation]:
        """One ``Generation`` per prompt, same order."""
        ...


@runtime_checkable
class KeyedBackend(Backend, Protocol):
    """A backend that places each prompt by a key: the agent loop passes each call's episode id, so that every
    call of an episode goes to the same server (``backends.server_pool``)."""

    def generate_keyed(self, keys: list[str], prompts: list[list[int]], params: SamplingParams) -> list[Generation]:
        """One ``Generation`` per prompt, same order; ``keys[i]`` places ``prompts[i]``."""
        ...


@dataclass(frozen=True)
class Progress:
    """What one request of an async engine sampled since its last ``Progress``: ``ids``, their ``logprobs``
    (the semantics above), and when asked, per id the ``top`` alternatives (id, log-prob), most likely
    first; ``finish_reason`` is set on the request's last one."""

    ids: list[int]
    logprobs: list[float]
    top: list[list[tuple[int, float]]] | None = None
    finish_reason: FinishReason | None = None


class AsyncEngine(Protocol):
    """An engine that batches continuously (vLLM's ``AsyncLLM``): every request is submitted on its own,
    as it arrives, and streams what it samples. Used inside one event loop."""

    tokenizer: PreTrainedTokenizerBase
    max_model_len: int
    nucleus: bool  # whether top_p < 1 keeps the full-vocabulary log-probs above (vLLM's do not)
    shaping: bool  # whether it applies the shaping options of SamplingParams

    def stream(self, prompt: list[int], params: SamplingParams, *, index: int, top_k: int,
               request_id: str) -> AsyncIterator[Progress]:
        """Sample one completion of ``prompt`` (``index``: its place in the caller's request, which offsets
        the seed); closing the iterator early aborts the request."""
        ...

    def shutdown(self) -> None: ...
