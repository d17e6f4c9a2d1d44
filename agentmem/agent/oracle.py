"""The oracle policy: a scripted writer that answers a memory policy's calls with no model.

It reads what a perfect reader would keep, from the task's annotation (``Task.facts``) and gold answer. The
final (answer) call gets the gold answer; every other call gets the memory policy's ``oracle_text(call,
task)`` (a policy that declares ``oracle``). The overwrite policy's, ``facts_memory`` here:
- a ``memory_update`` call at chunk ``i`` gets the facts read so far (``fact.chunk <= i``), each fact's text
  on its own line in reading order and nothing else; with none yet, ``EMPTY_MEMORY`` (``(empty)``), the text
  the next prompt shows for an empty memory, never a bare end-of-sequence (a teacher trained on bare EOS
  outputs learns to stop at once, and on-policy distillation then collapses the student to EOS); whole facts
  are kept first-fit in order (a fact that does not fit is left out, a later one may still go in) while
  the text, tokenized without special tokens, stays within ``max_new_tokens - 1`` tokens: room for eos;
- the final (answer) call gets ``task.answers[0]``; an answer over the call's limit is cut to it and
  finishes ``length``, as a model's would.

Outputs are ``tokenizer.encode(text, add_special_tokens=False) + [eos]``, finish reason ``stop``, and no
log-probs (``Generation.logprobs`` is None): nothing sampled them, so the stored calls (``role``
``oracle``) train by cross-entropy or distillation, never by the RL term. First-fit over a list that only
grows keeps every earlier choice, so each update's memory extends the one before.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import TYPE_CHECKING

from agentmem.agent.memory import Call, MemoryPolicy
from agentmem.agent.prompts import EMPTY_MEMORY
from agentmem.backends.types import Generation
from agentmem.errors import AgentError
from agentmem.records import Fact, FinishReason, Task

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

ROLE = "oracle"  # ``Invocation.role`` of the calls it writes


def evidence_read(facts: Sequence[Fact], chunk: int) -> bool:
    """Whether a perfect reader holds a fact after chunk ``chunk``: some fact with text is complete by it
    (the oracle's update there writes that fact, not ``EMPTY_MEMORY``)."""
    return any(f.chunk <= chunk and f.text.strip() for f in facts)


class OracleWriter:
    """Writes the output of each (call, task) pair; ``tokenizer`` is the student's (it counts the memory
    budget and encodes the outputs)."""

    name = ROLE

    def __init__(self, tokenizer: PreTrainedTokenizerBase, policy: MemoryPolicy | None = None):
        if tokenizer.eos_token_id is None:
            raise AgentError("the oracle needs a tokenizer with an end-of-sequence token")
        if policy is not None and not policy.oracle:
            raise AgentError(f"the oracle writes the calls of memory policies that declare ``oracle`` (their "
                             f"oracle_text), not {policy.name!r}'s")
        self.tokenizer = tokenizer
        self.policy = policy  # the memory policy whose non-final calls it writes (``AgentLoop`` binds it)

    def for_policy(self, policy: MemoryPolicy) -> OracleWriter:
        """This writer, bound to ``policy``: every non-final call is written by ``policy.oracle_text``."""
        return OracleWriter(self.tokenizer, policy)

    def generate(self, calls: Sequence[tuple[Call, Task]]) -> list[Generation]:
        """One ``Generation`` per (call, task), same order."""
        return [self.write(call, task) for call, task in calls]

    def write(self, call: Call, task: Task) -> Generation:
        t0 = time.perf_counter()
        ids = self._encode(self.text(call, task))
        if len(ids) < call.max_new_tokens:
            output, reason = [*ids, self.tokenizer.eos_token_id], FinishReason.stop
        else:
            output, reason = ids[: call.max_new_tokens], FinishReason.length
        return Generation(output, None, reason, time.perf_counter() - t0)

    def text(self, call: Call, task: Task) -> str:
        """The text the oracle writes for ``call``."""
        if call.final:
            return task.answers[0]
        if self.policy is None:
            raise AgentError(f"an oracle bound to no memory policy writes only the final answer, not a "
                             f"{call.kind!r} call (``for_policy``)")
        return self.policy.oracle_text(call, task)

    def memory(self, facts: Sequence[Fact], chunk: int, budget: int) -> str:
        """``facts_memory`` with this writer's tokenizer."""
        return facts_memory(facts, chunk, budget, self.tokenizer)

    def _encode(self, text: str) -> list[int]:
        return _encode(self.tokenizer, text)


def facts_memory(facts: Sequence[Fact], chunk: int, budget: int, tokenizer: PreTrainedTokenizerBase) -> str:
    """The facts complete by ``chunk``, one a line, first-fit within ``budget`` tokens; ``EMPTY_MEMORY`` when
    none is (or none fits), so an update never writes an empty output."""
    kept: list[str] = []
    for fact in facts:
        text = fact.text.strip()
        if fact.chunk > chunk or not text:
            continue
        if len(_encode(tokenizer, "\n".join([*kept, text]))) <= budget:
            kept.append(text)
    return "\n".join(kept) if kept else EMPTY_MEMORY


def _encode(tokenizer: PreTrainedTokenizerBase, text: str) -> list[int]:
    return list(tokenizer.encode(text, add_special_tokens=False)) if text else []
