"""Prompt templates, rendered through the model's chat template into the exact token ids the backend
consumes. The rendered ids are what is stored as ``prompt_ids``; the text is kept for people only."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from agentmem import records

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

SYSTEM = "You are a careful reading agent. You read a long text in sections and keep a short memory."

UPDATE = (
    "Question: {question}\n\n"
    "Your memory so far:\n{memory}\n\n"
    "New section of the text:\n{chunk}\n\n"
    "Rewrite your memory. Keep every fact that may help answer the question, add the relevant facts from "
    "the new section, and drop the rest. Write only the new memory."
)

# Chunk first: the G samples of a task read the same question and chunk at a step and differ only in their
# memory, so everything before the memory is one shared token prefix (computed once per group: the
# transformers backend and the shared-prefix packing both use it). The instruction comes before the memory
# for the same reason.
UPDATE_CHUNK_FIRST = (
    "Question: {question}\n\n"
    "New section of the text:\n{chunk}\n\n"
    "Rewrite your memory. Keep every fact that may help answer the question, add the relevant facts from "
    "the new section, and drop the rest. Write only the new memory.\n\n"
    "Your memory so far:\n{memory}"
)

ANSWER = (
    "Question: {question}\n\n"
    "Your memory:\n{memory}\n\n"
    "Answer the question from your memory. Reply with the short answer only."
)

EMPTY_MEMORY = records.EMPTY_MEMORY  # what the prompt shows for nothing held


@dataclass(frozen=True)
class Prompt:
    ids: list[int]
    text: str


def render(tokenizer: PreTrainedTokenizerBase, user: str, system: str | None = SYSTEM) -> Prompt:
    messages = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": user}]
    text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    return Prompt(ids=list(ids), text=text)


def update_prompt(tokenizer: PreTrainedTokenizerBase, question: str, memory: str, chunk: str,
                  layout: str = "memory-first") -> Prompt:
    """The update call's prompt; ``layout`` is ``memory-first`` (``UPDATE``: question, memory, chunk) or
    ``chunk-first`` (``UPDATE_CHUNK_FIRST``: question, chunk, instruction, memory)."""
    template = {"memory-first": UPDATE, "chunk-first": UPDATE_CHUNK_FIRST}.get(str(layout))
    if template is None:
        raise ValueError(f"unknown prompt layout {layout!r}: use memory-first or chunk-first")
    return render(tokenizer, template.format(question=question, memory=memory or EMPTY_MEMORY, chunk=chunk))


def answer_prompt(tokenizer: PreTrainedTokenizerBase, question: str, memory: str) -> Prompt:
    return render(tokenizer, ANSWER.format(question=question, memory=memory or EMPTY_MEMORY))
