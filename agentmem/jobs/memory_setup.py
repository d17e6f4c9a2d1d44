"""The memory policy of a rollout or evaluation job: built from the registry, with what it needs from the store.

A policy is pure (``agentmem.agent.memory``): it never reads the store. A policy that needs stored data to be
built (the ``teacher`` policy's memory bank) gets it here, at construction, from the job's store.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from agentmem.agent.memory import MemoryPolicy
from agentmem.agent.registry import memory_policy, policy_class, policy_options
from agentmem.agent.teacher_memory import TeacherMemoryPolicy
from agentmem.config import AgentConfig
from agentmem.jobs.memories import load_bank

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

    from store.engine import Store


def memory_for(store: Store, tokenizer: PreTrainedTokenizerBase, config: AgentConfig) -> MemoryPolicy:
    """The memory policy ``config.memory_policy`` with ``config.memory_options``, for ``tokenizer``.
    ``teacher``: its bank is the memories of build run ``memories=`` (``agentmem memories build``)."""
    if policy_class(config.memory_policy) is TeacherMemoryPolicy:
        options = policy_options(config.memory_policy, config.memory_options)
        _, bank = load_bank(store, options.memories)
        return TeacherMemoryPolicy.build(tokenizer, config, options, bank=bank)
    return memory_policy(config.memory_policy, tokenizer, config)
