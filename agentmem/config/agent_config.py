"""How the agent reads: ``AgentConfig``, a section of every rollout's config."""

from __future__ import annotations

from typing import Any

from pydantic import Field

from agentmem.config.base import Frozen
from agentmem.config.choices import PromptLayout


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

