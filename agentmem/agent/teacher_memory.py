"""The ``teacher`` memory policy (AMD, DuoMem): overwrite, with teacher-written workflow memories in the prompt.

A bank of workflow memories (``WorkflowMemory``, written by ``agentmem memories build`` from a teacher's
successful episodes) is given at construction (the policy declares ``memory_bank = "memories"``:
``agentmem.jobs.memory_setup.memory_for`` loads it from the store; the policy does no I/O). At the task start the policy picks the ``k`` memories whose source question
is most similar to the task's question (BM25, ``agentmem.agent.retrieval.top_k``; best first, ties to the
earlier memory of the bank) and keeps them for the whole episode.

The calls are overwrite's (``memory_update`` per chunk, then ``answer``) with overwrite's user messages
(``prompts.UPDATE``/``UPDATE_CHUNK_FIRST``/``ANSWER``); the memories go at the start of every call's
prompt, in the system message: ``prompts.SYSTEM``, a blank line, then ``WORKFLOW`` with the memories
numbered ``Workflow 1:``, ``Workflow 2:``... (each call of a memory agent is a fresh context, so each call
sees them, before the question). The episode's own memory (``memory_text``) is overwrite's, unchanged.

Options (``--memory-option``): ``memories`` (the build run id of the bank; required), ``k`` (default 1, as
AMD found best for small students).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

from pydantic import BaseModel, ConfigDict, Field, field_validator

from agentmem.agent.memory import Call, MemoryPolicyBase
from agentmem.agent.overwrite import ANSWER, UPDATE, OverwritePolicy, OverwriteState
from agentmem.agent.prompts import ANSWER as ANSWER_TEMPLATE
from agentmem.agent.prompts import EMPTY_MEMORY, SYSTEM, UPDATE_CHUNK_FIRST, Prompt, render
from agentmem.agent.prompts import UPDATE as UPDATE_TEMPLATE
from agentmem.agent.retrieval import top_k
from agentmem.config import AgentConfig, PromptLayout
from agentmem.records import Invocation, Task, WorkflowMemory

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

WORKFLOW = "Workflow memories from similar solved tasks (strategies, not answers):\n\n{memories}"


class TeacherOptions(BaseModel):
    """``--memory-option`` values of the teacher policy."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    memories: str
    k: int = Field(1, ge=1)

    @field_validator("memories", mode="before")
    @classmethod
    def _id_text(cls, value: object) -> object:
        return str(value) if isinstance(value, int) else value  # KEY=VALUE values are JSON: an all-digit id


def workflow_system(memories: Sequence[str]) -> str:
    """The system message of every call when ``memories`` were retrieved (``SYSTEM`` when none)."""
    if not memories:
        return SYSTEM
    blocks = "\n\n".join(f"Workflow {n}:\n{text}" for n, text in enumerate(memories, 1))
    return f"{SYSTEM}\n\n{WORKFLOW.format(memories=blocks)}"


@dataclass(frozen=True)
class TeacherState:
    """The retrieved memories' texts (best first) and overwrite's state."""

    workflows: tuple[str, ...]
    memory: OverwriteState = field(default_factory=OverwriteState)


class TeacherMemoryPolicy(MemoryPolicyBase[TeacherState]):
    """Overwrite with the ``k`` most similar workflow memories of ``bank`` in every prompt (module docstring)."""

    name = "teacher"
    kinds = (UPDATE, ANSWER)
    Options = TeacherOptions
    oracle = True
    rewrite_kind = UPDATE
    memory_bank = "memories"

    def __init__(self, tokenizer: PreTrainedTokenizerBase, config: AgentConfig, options: TeacherOptions,
                 bank: Sequence[WorkflowMemory]):
        self.overwrite = OverwritePolicy(tokenizer, config)
        self.tokenizer = tokenizer
        self.bank = list(bank)
        self.k = options.k

    @classmethod
    def build(cls, tokenizer: PreTrainedTokenizerBase, config: AgentConfig, opts: TeacherOptions,
              bank: Sequence[WorkflowMemory]) -> TeacherMemoryPolicy:
        """``bank``: the memories of build run ``opts.memories`` (``registry.memory_policy`` loads them)."""
        return cls(tokenizer, config, opts, bank)

    def retrieve(self, question: str) -> list[WorkflowMemory]:
        """The ``k`` memories whose source question is most similar to ``question``, best first."""
        if not self.bank:
            return []
        return [self.bank[i] for i in top_k(question, [m.question for m in self.bank], self.k)]

    def initial_state(self, task: Task) -> TeacherState:
        return TeacherState(tuple(m.text for m in self.retrieve(task.question)))

    def next_call(self, state: TeacherState, task: Task) -> Call:
        call = self.overwrite.next_call(state.memory, task)
        memory = state.memory.memory or EMPTY_MEMORY
        if call.kind == UPDATE:
            template = UPDATE_TEMPLATE if self.overwrite.layout is PromptLayout.memory_first else UPDATE_CHUNK_FIRST
            user = template.format(question=task.question, memory=memory, chunk=call.chunk_text)
        else:
            user = ANSWER_TEMPLATE.format(question=task.question, memory=memory)
        return replace(call, prompt=self._render(user, state.workflows))

    def consume(self, state: TeacherState, call: Call, output_ids: list[int], output_text: str) -> TeacherState:
        return replace(state, memory=self.overwrite.consume(state.memory, call, output_ids, output_text))

    def memory_text(self, state: TeacherState) -> str:
        return state.memory.memory

    def resume(self, task: Task, stored: Sequence[Invocation]) -> TeacherState:
        return TeacherState(self.initial_state(task).workflows, self.overwrite.resume(task, stored))

    def oracle_text(self, call: Call, task: Task) -> str:
        """Overwrite's: the workflows change the prompt, not what a perfect reader keeps."""
        return self.overwrite.oracle_text(call, task)

    def _render(self, user: str, workflows: Sequence[str]) -> Prompt:
        return render(self.tokenizer, user, system=workflow_system(workflows))
