"""The memory policies by name: ``AgentConfig.memory_policy`` picks one, and every check of a policy's name,
call kinds or options reads the policy's class from here.

A policy is one class (``agentmem.agent.memory.MemoryPolicyBase``) that declares its name, call kinds,
options model and capabilities. The built-in ones are listed below; a package adds its own through the
entry-point group ``agentmem.memory_policies`` (entry name = policy name, object = the class), e.g. in its
pyproject.toml::

    [project.entry-points."agentmem.memory_policies"]
    notes = "my_package.notes:NotesPolicy"

Entry points are read on the first look-up, not at import (no plug-in is imported before it is needed).
``register_memory_policy(cls)`` adds a class in-process (tests).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable, Sequence
from importlib.metadata import entry_points
from typing import TYPE_CHECKING, Any

from pydantic import ValidationError

from agentmem.agent.events_memory import EventsPolicy
from agentmem.agent.log_memory import LogPolicy
from agentmem.agent.memory import MemoryPolicy
from agentmem.agent.overwrite import OverwritePolicy
from agentmem.agent.routed_memory import RoutedPolicy
from agentmem.agent.teacher_memory import TeacherMemoryPolicy
from agentmem.config import KIND_ALIASES, SERVE_KINDS, AgentConfig
from agentmem.errors import AgentError, ConfigError

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

    from agentmem.records import WorkflowMemory

GROUP = "agentmem.memory_policies"
_BUILT_IN: tuple[type, ...] = (OverwritePolicy, EventsPolicy, LogPolicy, RoutedPolicy, TeacherMemoryPolicy)
_ADDED: dict[str, type] = {}


@functools.cache
def _plugins() -> dict[str, Any]:
    return {ep.name: ep for ep in entry_points(group=GROUP)}


def _check(name: str, cls: Any) -> type:
    declared = getattr(cls, "name", None)
    if declared != name:
        raise AgentError(f"memory policy {name!r}: its class {cls!r} declares name {declared!r}")
    if not getattr(cls, "kinds", None):
        raise AgentError(f"memory policy {name!r}: its class declares no call kinds (``kinds``)")
    return cls


def register_memory_policy(cls: type) -> None:
    """Make ``cls`` (a ``MemoryPolicyBase`` subclass) the policy ``cls.name``. Registering the same class
    again is a no-op; another class under a taken name is an ``AgentError``."""
    name = getattr(cls, "name", "")
    if not name:
        raise AgentError("a memory policy class declares a non-empty ``name``")
    known = _ADDED.get(name) or next((c for c in _BUILT_IN if c.name == name), None)
    if known is None and name in _plugins():
        known = policy_class(name)
    if known is not None and known is not cls:
        raise AgentError(f"memory policy {name!r} is registered already")
    _ADDED[name] = _check(name, cls)


def memory_policy_names() -> list[str]:
    return sorted({c.name for c in _BUILT_IN} | set(_ADDED) | set(_plugins()))


def policy_class(name: str) -> type[MemoryPolicy]:
    """The class of the policy registered as ``name`` (built in, added, or an entry point, loaded now)."""
    for cls in _BUILT_IN:
        if cls.name == name:
            return cls
    if name in _ADDED:
        return _ADDED[name]
    ep = _plugins().get(name)
    if ep is None:
        raise AgentError(f"unknown memory policy {name!r}; registered: {', '.join(memory_policy_names())}")
    return _check(name, ep.load())


def replayable_policies() -> list[str]:
    """The policies whose stored calls ReOPD replay branches from (they declare ``replayable``)."""
    return [n for n in memory_policy_names() if policy_class(n).replayable]


def policy_options(name: str, values: dict[str, Any]) -> Any:
    """``values`` (``AgentConfig.memory_options``) validated as policy ``name``'s ``Options``; a bad or unknown
    option is one ``AgentError`` line."""
    model = policy_class(name).Options
    try:
        return model.model_validate(values)
    except ValidationError as exc:
        problems = "; ".join(f"{'.'.join(map(str, e['loc'])) or 'options'}: "
                             + ("unknown option" if e["type"] == "extra_forbidden" else e["msg"]) for e in exc.errors())
        known = ", ".join(model.model_fields) or "none"
        raise AgentError(f"memory policy {name!r}: bad --memory-option ({problems}); known: {known}") from None


def memory_policy(tokenizer: PreTrainedTokenizerBase, config: AgentConfig,
                  load_bank: Callable[[str], Sequence[WorkflowMemory]] | None = None) -> MemoryPolicy:
    """The policy ``config.memory_policy``, built for ``tokenizer`` and ``config`` (its options checked): the
    one way every policy is built. A policy that declares ``memory_bank`` gets ``bank=load_bank(run id)``,
    the run id being that option's value (``jobs.memory_setup.memory_for`` loads from the job's store)."""
    name = config.memory_policy
    cls: Any = policy_class(name)
    options = policy_options(name, config.memory_options)
    if cls.memory_bank is None:
        return cls.build(tokenizer, config, options)
    run = getattr(options, cls.memory_bank)
    if load_bank is None:
        raise AgentError(f"memory policy {name!r} needs its memory bank (build run {run}): a job "
                         "builds it with agentmem.jobs.memory_setup.memory_for")
    return cls.build(tokenizer, config, options, bank=load_bank(run))


def rewrite_kinds(names: Iterable[str]) -> dict[str, str]:
    """Of the policies ``names``, those that declare a ``rewrite_kind``, each to that kind (a name no
    installed package registers is left out: its stored calls stay readable)."""
    known = set(memory_policy_names())
    return {n: kind for n in set(names) & known if (kind := policy_class(n).rewrite_kind) is not None}


def call_kinds() -> list[str]:
    """Every call kind a stored invocation can have: each registered policy's, then ``agentmem serve``'s."""
    kinds: list[str] = []
    built_in = [c.name for c in _BUILT_IN]
    for name in built_in + [n for n in memory_policy_names() if n not in built_in]:
        kinds += [k for k in policy_class(name).kinds if k not in kinds]
    return kinds + [k for k in SERVE_KINDS if k not in kinds]


def check_kinds(kinds: Iterable[str] | None) -> None:
    """A ``ConfigError`` naming the kinds of ``kinds`` that no registered policy makes (None: all kinds)."""
    if kinds is None:
        return
    allowed = call_kinds()
    bad = [str(k) for k in kinds if str(k) not in allowed]
    if bad:
        aliases = ", ".join(f"{a} = {k}" for a, k in KIND_ALIASES.items())
        raise ConfigError(f"unknown call kind(s) {bad}: give comma-separated {', '.join(allowed)} ({aliases})")
