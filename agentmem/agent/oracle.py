"""The oracle policy: a scripted writer that answers the overwrite policy's calls with no model.

It reads what a perfect reader would keep, from the task's annotation (``Task.facts``) and gold answer:
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

from agentmem.agent.memory import Call
from agentmem.agent.overwrite import UPDATE
from agentmem.agent.prompts import EMPTY_MEMORY
from agentmem.errors import AgentError
from agentmem.policy.types import Generation
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

    def __init__(self, tokenizer: PreTrainedTokenizerBase, policy: object | None = None):
        if tokenizer.eos_token_id is None:
            raise AgentError("the oracle needs a tokenizer with an end-of-sequence token")
        self.tokenizer = tokenizer
        self.policy = policy  # a memory policy with ``oracle_text(call, task)`` writes its own call kinds

    def for_policy(self, policy: object) -> OracleWriter:
        """This writer, bound to ``policy``: calls of kinds other than overwrite's ``memory_update`` and the
        final answer are written by ``policy.oracle_text(call, task)`` (an ``OracleAware`` policy)."""
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
        if call.kind != UPDATE and hasattr(self.policy, "oracle_text"):
            return self.policy.oracle_text(call, task)  # type: ignore[union-attr]
        if call.kind != UPDATE or call.chunk_index is None:
            raise AgentError(f"the oracle writes only the overwrite policy's calls ({UPDATE!r} and the final "
                             f"answer), not a {call.kind!r} call")
        return self.memory(task.facts, call.chunk_index, call.max_new_tokens - 1)

    def memory(self, facts: Sequence[Fact], chunk: int, budget: int) -> str:
        """The facts complete by ``chunk``, one a line, first-fit within ``budget`` tokens; ``EMPTY_MEMORY``
        when none is (or none fits), so an update never writes an empty output."""
        kept: list[str] = []
        for fact in facts:
            text = fact.text.strip()
            if fact.chunk > chunk or not text:
                continue
            if len(self._encode("\n".join([*kept, text]))) <= budget:
                kept.append(text)
        return "\n".join(kept) if kept else EMPTY_MEMORY

    def _encode(self, text: str) -> list[int]:
        return list(self.tokenizer.encode(text, add_special_tokens=False)) if text else []
