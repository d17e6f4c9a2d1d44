"""The overwrite memory policy (the default): the memory is the whole output of the last update call.

One ``memory_update`` call per chunk with (question, memory, chunk), whose output, special tokens dropped
and cut to ``memory_tokens`` tokens, becomes the new memory; then one ``answer`` call with (question,
memory). Prompts are ``agentmem.agent.prompts.UPDATE``/``ANSWER``; the stored kinds are
``InvocationKind.memory_update``/``answer`` (stored data never changes with this module).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from agentmem.agent.memory import Call, MemoryPolicyBase, NoOptions
from agentmem.agent.oracle import facts_memory
from agentmem.agent.prompts import answer_prompt, update_prompt
from agentmem.config import AgentConfig
from agentmem.records import Invocation, InvocationKind, Task

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

UPDATE = InvocationKind.memory_update.value
ANSWER = InvocationKind.answer.value


@dataclass(frozen=True)
class OverwriteState:
    """The memory text and how many chunks it has read."""

    memory: str = ""
    chunks_read: int = 0


class OverwritePolicy(MemoryPolicyBase[OverwriteState]):
    """New memory = the update call's output (special tokens dropped), cut to ``memory_tokens`` tokens. The
    oracle writes an update as the facts read so far (``agentmem.agent.oracle.facts_memory``)."""

    name = "overwrite"
    kinds = (UPDATE, ANSWER)
    oracle = True
    replayable = True
    rewrite_kind = UPDATE

    def __init__(self, tokenizer: PreTrainedTokenizerBase, config: AgentConfig):
        self.tokenizer = tokenizer
        self.layout = config.prompt_layout
        self.memory_tokens = config.memory_tokens
        self.answer_max_new_tokens = config.answer_max_new_tokens

    @classmethod
    def build(cls, tokenizer: PreTrainedTokenizerBase, config: AgentConfig, options: NoOptions) -> OverwritePolicy:
        return cls(tokenizer, config)

    def initial_state(self, task: Task) -> OverwriteState:
        return OverwriteState()

    def next_call(self, state: OverwriteState, task: Task) -> Call:
        i = state.chunks_read
        if i < len(task.chunks):
            chunk = task.chunks[i]
            return Call(UPDATE, update_prompt(self.tokenizer, task.question, state.memory, chunk, self.layout.value),
                        self.memory_tokens, chunk_text=chunk, chunk_index=i)
        return Call(ANSWER, answer_prompt(self.tokenizer, task.question, state.memory),
                    self.answer_max_new_tokens, final=True)

    def consume(self, state: OverwriteState, call: Call, output_ids: list[int], output_text: str) -> OverwriteState:
        if call.kind == UPDATE:
            return OverwriteState(self.update(state.memory, output_ids), state.chunks_read + 1)
        return state

    def memory_text(self, state: OverwriteState) -> str:
        return state.memory

    def resume(self, task: Task, stored: Sequence[Invocation]) -> OverwriteState:
        if not stored:
            return self.initial_state(task)
        return OverwriteState(stored[-1].memory_after, sum(1 for inv in stored if inv.kind == UPDATE))

    def oracle_text(self, call: Call, task: Task) -> str:
        if call.kind != UPDATE or call.chunk_index is None:
            return super().oracle_text(call, task)
        return facts_memory(task.facts, call.chunk_index, call.max_new_tokens - 1, self.tokenizer)

    def update(self, memory_before: str, output_ids: list[int]) -> str:
        """The memory after an update call that produced ``output_ids``."""
        special = set(self.tokenizer.all_special_ids)
        kept = [t for t in output_ids if t not in special][: self.memory_tokens]
        return self.tokenizer.decode(kept, skip_special_tokens=True).strip()
