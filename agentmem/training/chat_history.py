"""The ``persistent_chat`` teacher context: an episode's earlier calls as one well-formed multi-turn chat.

``persistent`` concatenates the stored calls as they are: one whole conversation per call (a system
prompt and the question every time, turns that never close). ``persistent_chat`` is the faithful
full-history baseline: for call ``t`` of an episode the teacher reads

    system (once) | user_0 | assistant: output_0 | ... | user_{t-1} | assistant: output_{t-1} | user_t
    | generation prompt | the stored output ids of call t (the actions, unchanged)

rendered by the teacher tokenizer's chat template (``apply_chat_template``, then tokenised without added
special tokens, as the agent renders its prompts). The messages come from what each invocation stored:
its ``prompt_text`` (the rendered ``[system, user]`` + generation prompt the model read) is split back
into its system and user contents with the same template, and checked by rendering them again; an
earlier call's reply is its ``output_text`` (decoded, special tokens dropped: the template closes the
turn). The system message is the current call's.
"""

from __future__ import annotations

from collections.abc import Sequence

from jinja2 import TemplateError
from transformers import PreTrainedTokenizerBase

from agentmem.errors import TrainingError
from agentmem.records import Invocation

_SYSTEM, _USER = "\ue000", "\ue001"  # private-use characters: probes no stored prompt contains


def _render(tokenizer: PreTrainedTokenizerBase, messages: list[dict[str, str]]) -> str:
    return tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)


def _turns(system: str | None, user: str) -> list[dict[str, str]]:
    return ([{"role": "system", "content": system}] if system is not None else []) + [
        {"role": "user", "content": user}]


class ChatHistory:
    """``conversation(history, inv) -> ids`` for ``replay.rebuild(..., conversation=...)``, caching each
    call's split prompt (every later call of the episode reads it again)."""

    def __init__(self, tokenizer: PreTrainedTokenizerBase):
        self.tokenizer = tokenizer
        self._split: dict[str, tuple[str | None, str]] = {}

    def messages(self, history: Sequence[Invocation], inv: Invocation) -> list[dict[str, str]]:
        """The chat of ``inv`` under ``persistent_chat``, up to its user turn."""
        system, _ = self.split(inv)
        out = [{"role": "system", "content": system}] if system is not None else []
        for h in history:
            out += [{"role": "user", "content": self.split(h)[1]}, {"role": "assistant", "content": h.output_text}]
        return out + [{"role": "user", "content": self.split(inv)[1]}]

    def __call__(self, history: Sequence[Invocation], inv: Invocation) -> list[int]:
        text = _render(self.tokenizer, self.messages(history, inv))
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def split(self, inv: Invocation) -> tuple[str | None, str]:
        """(system content or None, user content) of a stored prompt rendered as one ``[system?, user]``
        turn with the generation prompt. Raises TrainingError when this template cannot have rendered it."""
        if inv.id not in self._split:
            self._split[inv.id] = self._parse(inv)
        return self._split[inv.id]

    def _parse(self, inv: Invocation) -> tuple[str | None, str]:
        text = inv.prompt_text
        for system in (_SYSTEM, None):
            try:
                probe = _render(self.tokenizer, _turns(system, _USER))
            except TemplateError:  # a template without a system role
                continue
            head, _, tail = probe.partition(_USER)
            if not (text.startswith(head.split(_SYSTEM)[0]) and text.endswith(tail)):
                continue
            inner = text[: len(text) - len(tail)]
            found: tuple[str | None, str] | None
            if system is None:
                found = (None, inner[len(head):]) if inner.startswith(head) else None
            else:
                before, _, mid = head.partition(_SYSTEM)
                content, sep, user = inner[len(before):].partition(mid)
                found = (content, user) if sep else None
            if found is not None and _render(self.tokenizer, _turns(*found)) == text:
                return found
        raise TrainingError(f"invocation {inv.id}: its stored prompt_text is not one [system, user] turn of the "
                            "teacher's chat template, so the persistent_chat context cannot rebuild its messages")
