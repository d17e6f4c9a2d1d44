"""A deterministic backend for tests: it answers with scripted text and records what it was asked."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from agentmem.backends.types import Generation, SamplingParams
from agentmem.records import FinishReason

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase


class ScriptedBackend:
    """Answers each prompt with a scripted response, tokenised without special tokens.

    ``responses`` is either a function of the prompt ids, or a list consumed in order (one item per
    prompt, across calls; running out raises ``IndexError``). The output is cut to
    ``max_new_tokens`` (finish reason ``length``); otherwise the tokenizer's eos id is appended
    (finish reason ``stop``), as a real backend would sample it. Log-probs are all 0.0. Every prompt
    consumed is appended to ``seen_prompts``.
    """

    name = "scripted"

    def __init__(
        self,
        tokenizer: PreTrainedTokenizerBase,
        responses: Callable[[list[int]], str] | list[str],
    ) -> None:
        self.tokenizer = tokenizer
        self._responses = responses
        self._next = 0
        self.seen_prompts: list[list[int]] = []

    def _respond(self, prompt: list[int]) -> str:
        if callable(self._responses):
            return self._responses(prompt)
        if self._next >= len(self._responses):
            raise IndexError(f"ScriptedBackend ran out of responses after {self._next}")
        text = self._responses[self._next]
        self._next += 1
        return text

    def generate(self, prompts: list[list[int]], params: SamplingParams) -> list[Generation]:
        start = time.perf_counter()
        out = []
        for prompt in prompts:
            self.seen_prompts.append(list(prompt))
            ids = self.tokenizer.encode(self._respond(list(prompt)), add_special_tokens=False)
            eos = self.tokenizer.eos_token_id
            if eos is not None:
                ids.append(eos)
            reason = FinishReason.stop if eos is not None else FinishReason.length
            if len(ids) > params.max_new_tokens:
                ids, reason = ids[: params.max_new_tokens], FinishReason.length
            out.append(Generation(ids, [0.0] * len(ids), reason, time.perf_counter() - start))
        return out
