"""The ``routed`` memory policy (Router-Mem): a cheap retrieval pass, a one-token sufficiency router, and the
full overwrite pass only when the router says the retrieved chunks are not enough.

Calls of one episode, in order:
1. ``route`` (``max_new_tokens`` 1): ``ROUTE`` with the question and the ``k`` chunks BM25 ranks best for the
   question (``agentmem.agent.retrieval.top_k``; shown in reading order, each as ``[i] chunk`` with its
   chunk index ``i``). The model answers yes (the passages suffice) or no.
2. If ``P(yes) >= threshold``: one ``answer`` call (final) with ``ANSWER_RETRIEVED``: question and the same
   passages. The episode read only the retrieved chunks.
3. Otherwise overwrite's full pass, with overwrite's own calls and prompts (``OverwritePolicy``): one
   ``memory_update`` per chunk, then the final ``answer`` from memory.

P(yes), from the one sampled token and its stored log-prob ``lp`` (cast to float32, as the store keeps it,
so a resumed episode decides exactly as the live one did): the token's text, lower-cased with non-letters
dropped, is "yes"-like when it is a non-empty prefix of "yes" (``y``, ``ye``, ``yes``) and "no"-like when a
non-empty prefix of "no"; then ``P(yes) = exp(lp)`` for a yes-like token, ``1 - exp(lp)`` for a no-like one
(one minus the probability of the "no" it sampled: the rest of the mass is read as yes), and 0 for any other
token (an unreadable router sends the episode down the safe, full pass). An oracle-written route call has
no log-prob: ``exp(lp)`` is taken as 1, so P(yes) is 1 or 0. ``threshold`` 0 always answers from the
retrieved chunks; a threshold above 1 always runs the full pass.

Router labels come from the evidence (``router_label``): yes exactly when the retrieved chunk indices cover
every ``task.evidence_chunks`` index (a task with no evidence annotation is labelled no). The oracle writes
that label for the route call (``oracle_text``) and, as for overwrite, the update calls and the gold answer.

Options (``--memory-option``): ``threshold`` (float >= 0, default 0.5), ``k`` (chunks retrieved, default 3).
The memory text (``memory_before``/``memory_after``) is empty before the route call, then the line
``route: P(yes)=<p> -> answer from chunks [..]`` or ``... -> full pass``, followed in the full pass by a
blank line and overwrite's memory.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from agentmem.agent.memory import Call, MemoryPolicyBase, replay
from agentmem.agent.overwrite import ANSWER, UPDATE, OverwritePolicy, OverwriteState
from agentmem.agent.prompts import Prompt, render
from agentmem.agent.retrieval import top_k
from agentmem.config import AgentConfig
from agentmem.records import Invocation, Task

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

ROUTE = "route"

ROUTE_PROMPT = (
    "Question: {question}\n\n"
    "Retrieved passages:\n{passages}\n\n"
    "Do these passages contain everything needed to answer the question? Reply yes or no."
)

ANSWER_RETRIEVED = (
    "Question: {question}\n\n"
    "Retrieved passages:\n{passages}\n\n"
    "Answer the question from these passages. Reply with the short answer only."
)


class RoutedOptions(BaseModel):
    """``--memory-option`` values of the routed policy."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    threshold: float = Field(0.5, ge=0)
    k: int = Field(3, ge=1)


def router_label(task: Task, retrieved: Sequence[int]) -> bool:
    """Yes (the retrieved chunks suffice) exactly when they cover every evidence chunk of ``task``."""
    return bool(task.evidence_chunks) and set(task.evidence_chunks) <= set(retrieved)


def p_yes(token_text: str, logprob: float | None) -> float:
    """P(yes) of a one-token router answer ``token_text`` sampled with log-prob ``logprob`` (module docstring)."""
    word = re.sub(r"[^a-z]", "", token_text.lower())
    p = 1.0 if logprob is None else math.exp(float(np.float32(logprob)))
    if word and "yes".startswith(word):
        return p
    if word and "no".startswith(word):
        return 1.0 - p
    return 0.0


def passages(task: Task, retrieved: Sequence[int]) -> str:
    return "\n".join(f"[{i}] {task.chunks[i]}" for i in retrieved)


@dataclass(frozen=True)
class RoutedState:
    """The retrieved chunk indices (reading order), the router's P(yes) (None before the route call), whether
    it sent the episode to answer now, and the full pass's overwrite state."""

    retrieved: tuple[int, ...]
    p_yes: float | None = None
    answer_now: bool = False
    memory: OverwriteState = field(default_factory=OverwriteState)


class RoutedPolicy(MemoryPolicyBase[RoutedState]):
    """Route, then answer from the retrieved chunks or run overwrite's full pass (module docstring)."""

    name = "routed"
    kinds = (ROUTE, UPDATE, ANSWER)
    Options = RoutedOptions
    wants_logprobs = True
    oracle = True

    def __init__(self, tokenizer: PreTrainedTokenizerBase, config: AgentConfig, options: RoutedOptions):
        self.overwrite = OverwritePolicy(tokenizer, config)
        self.tokenizer = tokenizer
        self.answer_max_new_tokens = config.answer_max_new_tokens
        self.threshold, self.k = options.threshold, options.k

    @classmethod
    def build(cls, tokenizer: PreTrainedTokenizerBase, config: AgentConfig, opts: RoutedOptions) -> RoutedPolicy:
        return cls(tokenizer, config, opts)

    def retrieve(self, task: Task) -> tuple[int, ...]:
        """The top-``k`` chunks for the question, in reading order."""
        if not task.chunks:
            return ()
        return tuple(sorted(top_k(task.question, task.chunks, self.k)))

    def initial_state(self, task: Task) -> RoutedState:
        return RoutedState(self.retrieve(task))

    def next_call(self, state: RoutedState, task: Task) -> Call:
        if state.p_yes is None:
            return Call(ROUTE, self._prompt(ROUTE_PROMPT, task, state.retrieved), 1)
        if state.answer_now:
            return Call(ANSWER, self._prompt(ANSWER_RETRIEVED, task, state.retrieved), self.answer_max_new_tokens,
                        final=True)
        return self.overwrite.next_call(state.memory, task)

    def consume(self, state: RoutedState, call: Call, output_ids: list[int], output_text: str,
                logprobs: list[float] | None = None) -> RoutedState:
        if call.kind == ROUTE:
            p = p_yes(output_text, logprobs[0] if logprobs else None)
            return replace(state, p_yes=p, answer_now=p >= self.threshold)
        if call.kind == UPDATE:
            return replace(state, memory=self.overwrite.consume(state.memory, call, output_ids, output_text))
        return state

    def memory_text(self, state: RoutedState) -> str:
        if state.p_yes is None:
            return ""
        route = f"route: P(yes)={state.p_yes:.4f} -> "
        if state.answer_now:
            return route + f"answer from chunks {list(state.retrieved)}"
        return route + "full pass" + (f"\n\n{state.memory.memory}" if state.memory.memory else "")

    def resume(self, task: Task, stored: Sequence[Invocation]) -> RoutedState:
        return replay(self, task, stored)

    def oracle_text(self, call: Call, task: Task) -> str:
        """The route call's label from the evidence (``yes`` or ``no``); an update call's as overwrite's."""
        if call.kind != ROUTE:
            return self.overwrite.oracle_text(call, task)
        return "yes" if router_label(task, self.retrieve(task)) else "no"

    def _prompt(self, template: str, task: Task, retrieved: Sequence[int]) -> Prompt:
        return render(self.tokenizer, template.format(question=task.question, passages=passages(task, retrieved)))
