"""The memory policy of a rollout or evaluation job: built from the registry, with what it needs from the store.

A policy is pure (``agentmem.agent.memory``): it never reads the store. A policy that needs stored data to be
built (the ``teacher`` policy's memory bank) gets it here, at construction, from the job's store.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from agentmem.agent.memory import MemoryPolicy
from agentmem.agent.registry import memory_policy
from agentmem.config import AgentConfig

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

    from store.engine import Store


def memory_for(store: Store, tokenizer: PreTrainedTokenizerBase, config: AgentConfig) -> MemoryPolicy:
    """The memory policy ``config.memory_policy`` with ``config.memory_options``, for ``tokenizer``."""
    return memory_policy(config.memory_policy, tokenizer, config)
