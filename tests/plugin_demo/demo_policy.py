"""An out-of-tree memory policy: ``jotter`` keeps the last ``lines`` one-line jots, one ``jot`` call per chunk,
then answers from them. Everything agentmem needs is declared on the class."""

from __future__ import annotations

from dataclasses import dataclass, replace

from pydantic import BaseModel, ConfigDict, Field

from agentmem.agent.memory import Call, MemoryPolicyBase, replay
from agentmem.agent.prompts import render


class JotterOptions(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    lines: int = Field(2, ge=1)


@dataclass(frozen=True)
class JotState:
    jots: tuple[str, ...] = ()
    read: int = 0


class JotterPolicy(MemoryPolicyBase[JotState]):
    name = "jotter"
    kinds = ("jot", "answer")
    Options = JotterOptions
    oracle = True

    def __init__(self, tokenizer, memory_tokens: int, answer_tokens: int, lines: int):
        self.tokenizer, self.memory_tokens, self.answer_tokens, self.lines = tokenizer, memory_tokens, answer_tokens, lines

    @classmethod
    def build(cls, tokenizer, config, options: JotterOptions) -> JotterPolicy:
        return cls(tokenizer, config.memory_tokens, config.answer_max_new_tokens, options.lines)

    def initial_state(self, task):
        return JotState()

    def next_call(self, state, task):
        if state.read < len(task.chunks):
            chunk = task.chunks[state.read]
            return Call("jot", render(self.tokenizer, f"Question: {task.question}\nText: {chunk}\nJot one line."),
                        self.memory_tokens, chunk_text=chunk, chunk_index=state.read)
        jots = "\n".join(state.jots)
        return Call("answer", render(self.tokenizer, f"Question: {task.question}\nJots:\n{jots}\nAnswer."),
                    self.answer_tokens, final=True)

    def consume(self, state, call, output_ids, output_text):
        if call.kind == "jot":
            return replace(state, jots=(*state.jots, output_text.strip())[-self.lines:], read=state.read + 1)
        return state

    def memory_text(self, state):
        return "\n".join(state.jots)

    def resume(self, task, stored):
        return replay(self, task, stored)

    def oracle_text(self, call, task):
        done = [f.text for f in task.facts if f.chunk == call.chunk_index]
        return " ".join(done) or "nothing"
