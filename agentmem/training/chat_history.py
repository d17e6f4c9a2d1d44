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

A call recorded by ``agentmem serve`` from a chat carries the messages its client sent (``serve_calls``),
which may be a whole multi-turn chat (``[system?, user, assistant, tool, ..., user]``). Its "user turn" is
then those messages without a leading system message, used as they were sent, so user_k above stands for
all of call k's messages after its system message: the teacher reads

    system of call t (once) | call 0's messages | assistant: output_0 | ... | call t's messages
    | generation prompt | the stored output ids of call t

rendered with call t's ``tools``. A one-turn call gives the same chat either way. An agent that resends its
history in every call has that history twice here: ``aligned`` is its own full-history context.

A served call that is no chat turn (a ``/v1/completions`` call whose prompt is not one ``[system?, user]``
turn of the teacher's template) has no place in such a chat: ``replay.teacher_calls`` leaves it out of the selection (``chat_turns``),
counted, and the later calls of its episode read the chat without it. agentmem's own calls always are chat
turns: one that does not split is refused, as above.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from jinja2 import TemplateError
from transformers import PreTrainedTokenizerBase

from agentmem.errors import TrainingError
from agentmem.records import Invocation, ServeCall

if TYPE_CHECKING:
    from agentmem.training.selection import Selection

SERVED = "serve"  # the env of the episodes agentmem serve records (agentmem.serve.recorder.ENV)
_SYSTEM, _USER = "\ue000", "\ue001"  # private-use characters: probes no stored prompt contains


def _render(tokenizer: PreTrainedTokenizerBase, messages: list[dict[str, Any]],
            tools: list[dict[str, Any]] | None = None) -> str:
    return tokenizer.apply_chat_template(messages, tools=tools, add_generation_prompt=True, tokenize=False)


def _turns(system: str | None, user: str) -> list[dict[str, str]]:
    return ([{"role": "system", "content": system}] if system is not None else []) + [
        {"role": "user", "content": user}]


class ChatHistory:
    """``conversation(history, inv) -> ids`` for ``replay.rebuild(..., conversation=...)``, caching each
    call's split prompt (every later call of the episode reads it again). ``chats``: the served chat calls'
    messages and tools by invocation id (``Selection.chats``); other calls are read from their prompt text."""

    def __init__(self, tokenizer: PreTrainedTokenizerBase, chats: Mapping[str, ServeCall] | None = None):
        self.tokenizer = tokenizer
        self.chats = chats or {}
        self._split: dict[str, tuple[str | None, str]] = {}

    def messages(self, history: Sequence[Invocation], inv: Invocation) -> list[dict[str, Any]]:
        """The chat of ``inv`` under ``persistent_chat``, up to its last sent message."""
        system, turn = self.turn(inv)
        out: list[dict[str, Any]] = [{"role": "system", "content": system}] if system is not None else []
        for h in history:
            out += [*self.turn(h)[1], {"role": "assistant", "content": h.output_text}]
        return out + turn

    def __call__(self, history: Sequence[Invocation], inv: Invocation) -> list[int]:
        chat = self.chats.get(inv.id)
        text = _render(self.tokenizer, self.messages(history, inv), chat.tools if chat is not None else None)
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def turn(self, inv: Invocation) -> tuple[str | None, list[dict[str, Any]]]:
        """(system content or None, the call's other messages): a served chat's messages as its client sent
        them, else the split of its stored prompt text."""
        chat = self.chats.get(inv.id)
        if chat is None or not chat.messages:
            system, user = self.split(inv)
            return system, [{"role": "user", "content": user}]
        first, *rest = chat.messages
        if first.get("role") == "system":
            return first.get("content"), [dict(m) for m in rest]
        return None, [dict(m) for m in chat.messages]

    def is_chat(self, inv: Invocation) -> bool:
        """Whether ``inv`` reads as chat turns: a served chat call, or a prompt this template can split."""
        chat = self.chats.get(inv.id)
        if chat is not None and chat.messages:
            return True
        try:
            self.split(inv)
        except TrainingError:
            return False
        return True

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


def chat_turns(selection: Selection, tokenizer: PreTrainedTokenizerBase) -> Callable[[Invocation], bool]:
    """Whether a call of ``selection`` is a chat turn under ``tokenizer``'s template: every call outside the
    served episodes, and a served call whose prompt splits into one (``replay.teacher_calls`` leaves the others
    out of a ``persistent_chat`` teacher's selection)."""
    history = ChatHistory(tokenizer, selection.chats)
    return lambda inv: selection.episodes[inv.episode_id].env != SERVED or history.is_chat(inv)
