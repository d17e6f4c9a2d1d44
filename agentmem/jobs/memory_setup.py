"""The memory policy of a rollout or evaluation job: built by the registry, with what it needs from the store.

A policy is pure (``agentmem.agent.memory``): it never reads the store. A policy that declares a
``memory_bank`` option (the ``teacher`` policy) gets that bank here, at construction, from the job's store.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from agentmem.agent.memory import MemoryPolicy
from agentmem.agent.registry import memory_policy
from agentmem.config import AgentConfig
from agentmem.jobs.memories import load_bank

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

    from store.engine import Store


def memory_for(store: Store, tokenizer: PreTrainedTokenizerBase, config: AgentConfig) -> MemoryPolicy:
    """The memory policy ``config.memory_policy`` with ``config.memory_options``, for ``tokenizer``; its
    ``memory_bank``, if it declares one, is the memories of that build run (``agentmem memories build``)."""
    return memory_policy(tokenizer, config, lambda run: load_bank(store, run)[1])
