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
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from agentmem.records import FinishReason

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase


@dataclass(frozen=True)
class SamplingParams:
    """``temperature == 0`` means greedy; ``seed`` makes sampling reproducible for the same batch."""

    temperature: float = 1.0
    top_p: float = 1.0
    max_new_tokens: int = 128
    seed: int | None = None

    def __post_init__(self) -> None:
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {self.max_new_tokens}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


@dataclass(frozen=True)
class Generation:
    """One completion. ``output_ids`` and ``logprobs`` have the same length (``logprobs`` is None when no
    sampler wrote the ids: the oracle, ``agentmem.agent.oracle``); ``finish_reason`` is
    ``stop`` when the last token is an end-of-sequence token, ``length`` when ``max_new_tokens`` was
    reached. ``latency_s`` is the wall time from the start of the batched call until this sequence
    finished."""

    output_ids: list[int]
    logprobs: list[float] | None
    finish_reason: FinishReason
    latency_s: float


class Backend(Protocol):
    name: str
    tokenizer: PreTrainedTokenizerBase

    def generate(self, prompts: list[list[int]], params: SamplingParams) -> list[Generation]:
        """One ``Generation`` per prompt, same order."""
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

    def stream(self, prompt: list[int], params: SamplingParams, *, index: int, top_k: int,
               request_id: str) -> AsyncIterator[Progress]:
        """Sample one completion of ``prompt`` (``index``: its place in the caller's request, which offsets
        the seed); closing the iterator early aborts the request."""
        ...

    def shutdown(self) -> None: ...
