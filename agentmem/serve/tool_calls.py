"""Tool calls in a chat reply, returned as OpenAI ``tool_calls``: pure parsing of the decoded reply, no I/O.

When a chat request has ``tools`` (and ``tool_choice`` is not ``"none"``), the reply's text is parsed with
transformers' response parsing (``tokenizer.parse_response``): with the tokenizer's own
``response_template`` when the model ships one (the rendered prompt is the parser's ``prefix``, as the
library asks), else, when the chat template speaks the Hermes format (``<tool_call>{"name": ..,
"arguments": ..}</tool_call>``: Qwen2.5, Qwen3, SmolLM3, Hermes), with ``HERMES`` below. A template with
neither gets no parsing: the reply stays ``content`` text.

A reply with at least one well-formed call becomes ``message.tool_calls`` (``id``, ``type: "function"``,
``function.name``, ``function.arguments`` as a JSON string) and ``finish_reason: "tool_calls"``, its
``content`` the text outside the calls (None when there is none). A call that does not parse (truncated,
not JSON, no name) leaves the whole reply as ``content``, as vLLM's tool parsers do, except in a forced reply
(``tool_choice`` ``required`` or a named function: a grammar writes only calls) that ``max_tokens`` cut: its
calls completed before the cut come back as ``tool_calls``, the cut one is dropped, and the finish reason stays
``length``. Parsing changes only the response: the stored invocation keeps the sampled ids and their decoded
text.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from typing import Any

HERMES: dict[str, Any] = {
    "version": 1,
    "start_anchor": "<|im_start|>assistant\n",  # unused: the Hermes reply is parsed without a prefix
    "defaults": {"role": "assistant"},
    "fields": {
        "content": {"content": "text", "repeats": True, "join": "\n"},
        "tool_calls": {
            "open": "<tool_call>", "close": "</tool_call>", "content": "json", "repeats": True,
            "transform": {"type": "function", "function": {"name": "{content.name}",
                                                           "arguments": "{content.arguments}"}},
        },
    },
}


@dataclass(frozen=True)
class Reply:
    """A chat reply as OpenAI returns it: ``content`` (None when empty) and ``tool_calls`` (OpenAI dicts)."""

    content: str | None
    tool_calls: list[dict[str, Any]]
    cut: bool = False  # a forced reply cut by max_tokens: these calls completed before the cut

    @property
    def finish_reason(self) -> str | None:
        """``"tool_calls"`` when the reply calls a tool and was not cut, else None (the sampler's reason
        stands)."""
        return "tool_calls" if self.tool_calls and not self.cut else None


@dataclass(frozen=True)
class ToolCallParser:
    """Parses one request's replies. ``schema``: a transformers response template; ``prefix``: what the
    parser reads before the reply (the rendered prompt for the model's own template, "" for ``HERMES``)."""

    tokenizer: Any
    schema: dict[str, Any]
    prefix: str
    tools: list[dict[str, Any]]
    forced: bool = False  # tool_choice forces a call: the reply is calls only (constraints.py's grammar)

    @classmethod
    def for_request(cls, tokenizer, tools: list[dict[str, Any]] | None, tool_choice: Any,
                    prompt_text: str) -> ToolCallParser | None:
        """The parser of a chat request, or None when its replies are plain content."""
        if not tools or tool_choice == "none":
            return None
        forced = tool_choice == "required" or isinstance(tool_choice, dict)
        own = getattr(tokenizer, "response_template", None)
        if own is not None:
            return cls(tokenizer, own, prompt_text, tools, forced)
        template = tokenizer.chat_template if isinstance(tokenizer.chat_template, str) else ""
        if "<tool_call>" in template:
            return cls(tokenizer, HERMES, "", tools, forced)
        return None

    @property
    def opener(self) -> str | None:
        """The text that begins a tool call, where known (the Hermes format's); None: any text may."""
        return "<tool_call>" if self.schema is HERMES else None

    def parse(self, text: str, call_id: str, cut: bool = False) -> Reply:
        """``text``'s reply; tool call ``k`` gets the id ``call_{call_id}_{k}``. ``cut``: ``max_tokens`` ended
        the reply (a forced reply then keeps the calls completed before the cut)."""
        close = "</tool_call>"
        if cut and self.forced and self.opener is not None and close in text:
            whole = self.parse(text, call_id)
            if whole.tool_calls:
                return replace(whole, cut=True)
            done = self.parse(text[:text.rindex(close) + len(close)], call_id)
            return Reply(None, done.tool_calls, cut=True) if done.tool_calls else Reply(text, [])
        try:
            parsed = self.tokenizer.parse_response(text, self.schema, prefix=self.prefix, tools=self.tools)
            calls = [_openai_call(c, f"call_{call_id}_{k}") for k, c in enumerate(parsed.get("tool_calls") or [])]
        except (ValueError, KeyError, TypeError):  # a malformed call: the reply is text
            return Reply(text, [])
        if not calls:
            return Reply(text, [])
        content = parsed.get("content")
        return Reply(content if isinstance(content, str) and content.strip() else None, calls)


def _openai_call(call: Any, call_id: str) -> dict[str, Any]:
    function = call.get("function", call) if isinstance(call, dict) else None
    name = function.get("name") if isinstance(function, dict) else None
    if not isinstance(name, str) or not name:
        raise ValueError("a tool call without a name")
    arguments = function.get("arguments", {})
    if not isinstance(arguments, str):
        arguments = json.dumps(arguments, ensure_ascii=False)
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}
