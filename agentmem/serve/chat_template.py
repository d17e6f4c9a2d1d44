"""The chat template a server renders with, and the check that it renders what a request sends.

``agentmem serve --chat-template FILE`` replaces the tokenizer's template with FILE's Jinja text (``agentmem.config.load_template``); a
name of a template shipped in ``agentmem/serve/templates/`` works too (``chatml_tools``: ChatML with Hermes
tool calls, for SmolLM2 and other ChatML models).

``check_tools_render``: a template that has no tool format drops ``tools`` from the prompt (and renders an
earlier assistant turn's ``tool_calls`` as an empty turn) without an error. Such a request is refused with a
400 naming ``--chat-template``, found by rendering the request with and without its tools (and each
assistant message with and without its calls) and comparing: a template that renders them changes the text.
"""

from __future__ import annotations

import copy
from typing import Any

from agentmem.serve.protocol import bad_request

FIX = ("serve it with a chat template that renders them: `agentmem serve --chat-template FILE` "
       "(`--chat-template chatml_tools` for ChatML models such as the default SmolLM2)")


def with_template(tokenizer, text: str | None):
    """``tokenizer``, or a copy of it rendering with ``text`` (the original is left as it is)."""
    if text is None:
        return tokenizer
    tokenizer = copy.deepcopy(tokenizer)
    tokenizer.chat_template = text
    return tokenizer


def check_tools_render(tokenizer, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None,
                       rendered: str) -> None:
    """Raise a 400 when the template leaves out ``tools`` or an assistant message's ``tool_calls``;
    ``rendered`` is the request rendered with both."""

    def render(msgs: list[dict[str, Any]], tools_: list[dict[str, Any]] | None) -> str:
        return tokenizer.apply_chat_template(msgs, tools=tools_, add_generation_prompt=True, tokenize=False)

    if tools and render(messages, None) == rendered:
        raise bad_request("the model's chat template does not render `tools`: they would be left out of the "
                          f"prompt; {FIX}", "tools", code="unsupported_parameter")
    for k, m in enumerate(messages):
        if m.get("role") != "assistant" or not m.get("tool_calls"):
            continue
        bare = {key: v for key, v in m.items() if key != "tool_calls"}
        if render([*messages[:k], bare, *messages[k + 1:]], tools) == rendered:
            raise bad_request(f"the model's chat template does not render messages[{k}].tool_calls: the "
                              f"assistant's calls would be left out of the prompt; {FIX}", "messages",
                              code="unsupported_parameter")
