"""The memory policies by name: ``AgentConfig.memory_policy`` picks one.

A factory takes (tokenizer, agent config) and returns a policy whose ``name`` is the registered name, so
the name stored with every invocation is the name in the run's config. ``overwrite`` is built in.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from agentmem.agent.events_memory import EventsPolicy
from agentmem.agent.log_memory import LogPolicy
from agentmem.agent.memory import MemoryPolicy, PolicyFactory
from agentmem.agent.overwrite import OverwritePolicy
from agentmem.agent.routed_memory import RoutedPolicy
from agentmem.agent.teacher_memory import TeacherMemoryPolicy
from agentmem.config import AgentConfig
from agentmem.errors import AgentError

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

_FACTORIES: dict[str, PolicyFactory] = {
    OverwritePolicy.name: OverwritePolicy.from_config,
    EventsPolicy.name: EventsPolicy.from_config,
    LogPolicy.name: LogPolicy.from_config,
    RoutedPolicy.name: RoutedPolicy.from_config,
    TeacherMemoryPolicy.name: TeacherMemoryPolicy.from_config,  # its bank comes from jobs.memory_setup
}


def register_memory_policy(name: str, factory: PolicyFactory) -> None:
    """Make ``name`` a memory policy. Registering the same factory again is a no-op; another factory under a
    taken name is an ``AgentError``."""
    if not name:
        raise AgentError("a memory policy name is a non-empty string")
    known = _FACTORIES.get(name)
    if known is not None and known is not factory:
        raise AgentError(f"memory policy {name!r} is registered already")
    _FACTORIES[name] = factory


def memory_policy_names() -> list[str]:
    return sorted(_FACTORIES)


def memory_policy(name: str, tokenizer: PreTrainedTokenizerBase, config: AgentConfig) -> MemoryPolicy:
    """The policy registered as ``name``, built for ``tokenizer`` and ``config``."""
    factory = _FACTORIES.get(name)
    if factory is None:
        raise AgentError(f"unknown memory policy {name!r}; registered: {', '.join(memory_policy_names())}")
    policy = factory(tokenizer, config)
    if policy.name != name:
        raise AgentError(f"memory policy {name!r}: its factory built a policy named {policy.name!r}")
    return policy
