"""The memory-policy seam: what a policy is and the calls it asks for (``registry`` names the policies).

A memory policy owns its memory: a typed state per episode, the prompt of every call it wants, and how a
call's output changes the state. The agent loop (``agentmem.agent.loop``) owns everything else: batching,
routing each call kind to a backend, sampling seeds, storing invocations, budgets and episode outcomes.

Contract of a policy (``MemoryPolicy[S]``):
- states are values: ``consume`` returns a new state and never mutates the one it was given; a state is
  never ``None``;
- ``next_call(state, task)`` is a pure function of its arguments; it returns the ``final`` call (whose
  output is the answer) when the policy is ready to answer, and is never asked again after that;
- ``task.chunks`` are the chunks the policy may read (the loop has already cut them to ``max_chunks``);
- ``resume(task, stored)`` gives exactly the state that ``consume`` reached after those stored calls (in
  step order), so a killed rollout continues where the store says it stopped; ``replay`` does it for any
  deterministic policy.
What a policy is, beside its methods, it declares on its class, as the class attributes of
``MemoryPolicyBase`` (the registry and the jobs read them without building the policy):
- ``name``: the registered name, stored with every invocation (``AgentConfig.memory_policy``);
- ``kinds``: the call kinds it makes (``score``, ``distill``, ``sft`` and ``train`` accept them as ``kinds``);
- ``Options``: the pydantic model of its ``--memory-option`` values (``extra="forbid"``: a typo fails);
- ``wants_logprobs``: ``consume`` is called with ``logprobs=`` too: the sampled tokens' log-probs (None for
  oracle-written calls), e.g. a router thresholding P(yes);
- ``oracle``: ``oracle_text(call, task)`` writes every non-final call it makes, so ``--policy oracle`` runs it;
- ``replayable``: ReOPD replay (``rollout --replay-from``) may branch from its stored calls: every call's
  token limit is ``memory_tokens`` (the ``answer`` call's ``answer_max_new_tokens``), and its method
  ``update(memory_before, output_ids)`` gives the memory after a non-final call;
- ``rewrite_kind``: the call kind whose output is the whole memory after it (eval's empty-memory metrics
  read these calls; None: no such kind);
- ``memory_bank``: the option naming the ``agentmem memories build`` run whose workflow memories ``build``
  takes as ``bank=`` (a job loads them from its store; None: the policy reads no bank).
It is built by ``build(tokenizer, config, options)``, ``options`` an ``Options`` instance, and only through
``registry.memory_policy``; every default it reads is ``AgentConfig``'s or its ``Options``'. A policy that keeps
an episode log returns each stored call's entries from ``log_entries`` (the rollout stores them; default none).
A policy that cannot go on from an output (say, one it cannot parse) raises ``AgentError``: the loop ends
that episode ``failed`` and its siblings go on. Any other exception is a bug and propagates.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Generic, Protocol, TypeVar

from pydantic import BaseModel, ConfigDict

from agentmem.agent.prompts import Prompt
from agentmem.errors import AgentError
from agentmem.records import Invocation, LogEntry, Task

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

    from agentmem.config import AgentConfig

S = TypeVar("S")


@dataclass(frozen=True)
class Call:
    """One model call a policy wants. ``prompt`` holds the exact ids the backend will consume (rendered
    through the tokenizer's chat template by the policy) and their text; ``kind`` is stored as the
    invocation's kind and picks the backend; ``final``: this call's output is the episode's answer."""

    kind: str
    prompt: Prompt
    max_new_tokens: int
    chunk_text: str | None = None
    chunk_index: int | None = None
    final: bool = False

    def __post_init__(self) -> None:
        if not self.kind:
            raise AgentError("a call kind is a non-empty string")
        if self.max_new_tokens < 1:
            raise AgentError(f"call {self.kind!r}: max_new_tokens must be >= 1, got {self.max_new_tokens}")


class NoOptions(BaseModel):
    """The ``Options`` of a policy that takes no ``--memory-option``."""

    model_config = ConfigDict(frozen=True, extra="forbid")


class MemoryPolicy(Protocol[S]):
    """How an agent remembers: see the module docstring for the contract."""

    name: ClassVar[str]
    kinds: ClassVar[tuple[str, ...]]
    Options: ClassVar[type[BaseModel]]
    wants_logprobs: ClassVar[bool]
    oracle: ClassVar[bool]
    replayable: ClassVar[bool]
    rewrite_kind: ClassVar[str | None]
    memory_bank: ClassVar[str | None]

    def initial_state(self, task: Task) -> S:
        """The state before the episode's first call."""
        ...

    def next_call(self, state: S, task: Task) -> Call:
        """The next call this policy wants; the ``final`` one when it is ready to answer."""
        ...

    def consume(self, state: S, call: Call, output_ids: list[int], output_text: str) -> S:
        """The state after ``call`` produced ``output_ids`` (``output_text``: decoded, special tokens dropped)."""
        ...

    def memory_text(self, state: S) -> str:
        """The memory as a person reads it (stored as ``memory_before``/``memory_after``)."""
        ...

    def resume(self, task: Task, stored: Sequence[Invocation]) -> S:
        """The state after the episode's stored calls, in step order."""
        ...

    def oracle_text(self, call: Call, task: Task) -> str:
        """What the oracle writes for the non-final ``call`` (a pure function of the call and the task's
        annotation: facts, evidence, gold answer); only asked of a policy with ``oracle`` true."""
        ...

    def log_entries(self, invocation: Invocation) -> list[LogEntry]:
        """The episode-log entries the stored call appended (table ``memory_log``); none for most policies."""
        ...


class MemoryPolicyBase(Generic[S]):
    """The declarations of a policy (module docstring), with their defaults: subclass it and set what differs.
    ``kinds`` and ``name`` have no default."""

    name: ClassVar[str]
    kinds: ClassVar[tuple[str, ...]]
    Options: ClassVar[type[BaseModel]] = NoOptions
    wants_logprobs: ClassVar[bool] = False
    oracle: ClassVar[bool] = False
    replayable: ClassVar[bool] = False
    rewrite_kind: ClassVar[str | None] = None
    memory_bank: ClassVar[str | None] = None

    @classmethod
    def build(cls, tokenizer: PreTrainedTokenizerBase, config: AgentConfig, options: Any) -> MemoryPolicyBase[S]:
        """The policy for ``tokenizer`` and ``config``; ``options``: ``config.memory_options`` as ``Options``."""
        raise NotImplementedError

    def oracle_text(self, call: Call, task: Task) -> str:
        raise AgentError(f"the oracle writes no {call.kind!r} call of memory policy {self.name!r}")

    def log_entries(self, invocation: Invocation) -> list[LogEntry]:
        return []


def replay(policy: MemoryPolicy[S], task: Task, stored: Sequence[Invocation]) -> S:
    """``resume`` for any deterministic policy: re-plan each stored call and consume its stored output.
    A stored call of another kind than the policy would make now is an ``AgentError``."""
    state = policy.initial_state(task)
    for inv in stored:
        call = policy.next_call(state, task)
        if call.kind != inv.kind:
            raise AgentError(f"invocation {inv.id} (step {inv.step}): stored kind {inv.kind!r}, but policy "
                             f"{policy.name!r} would make a {call.kind!r} call")
        logprobs = None if inv.output_logprobs is None else inv.output_logprobs.tolist()
        state = consume(policy, state, call, inv.output_ids.tolist(), inv.output_text, logprobs)
    return state


def consume(policy: MemoryPolicy[S], state: S, call: Call, output_ids: list[int], output_text: str,
            logprobs: Sequence[float] | None) -> S:
    """``policy.consume``, passed ``logprobs=`` when the policy ``wants_logprobs`` (module docstring)."""
    if policy.wants_logprobs:
        return policy.consume(state, call, output_ids, output_text, logprobs=logprobs)  # type: ignore[call-arg]
    return policy.consume(state, call, output_ids, output_text)

