"""``POST /v1/chat/completions``: messages (and tools) rendered by the model's chat template
(``apply_chat_template(..., add_generation_prompt=True)``, tokenised without added special tokens, as the
agent loop renders its prompts); with ``tools``, tool calls in the reply come back as ``tool_calls``
(``tool_calls.py``). A template that would leave out the tools or an assistant's earlier calls gets the request
refused (``chat_template.check_tools_render``). ``response_format`` json_object/json_schema and a ``tool_choice``
that forces a call are enforced by a grammar (``constraints.py``), stored in ``serve_calls.sampling["constraint"]``."""

from __future__ import annotations

import asyncio
from typing import Any

from fastapi import APIRouter, Request

from agentmem.serve.calls import read_request
from agentmem.serve.chat_template import check_tools_render
from agentmem.serve.constraints import Constraint, of_request
from agentmem.serve.protocol import ChatRequest, bad_request
from agentmem.serve.recorder import Sent
from agentmem.serve.routes import calls, episode
from agentmem.serve.tool_calls import ToolCallParser

router = APIRouter()


@router.post("/chat/completions")
async def chat_completions(request: Request) -> Any:
    shared = calls(request)
    req = await read_request(request, ChatRequest)
    shared.check_request(req)
    if req.top_logprobs and not req.logprobs:
        raise bad_request("top_logprobs needs logprobs: true", "top_logprobs")
    # rendering and tokenizing a long chat takes a while: off the event loop, so other requests go on
    sent, ids, parser, constraint = await asyncio.to_thread(render, shared.tokenizer, req)
    prep = await shared.prepare(request, req, episode(request), [ids], sent, "chat", constraint=constraint)
    return await shared.respond(request, req, prep, chat=True, logprobs=req.logprobs, tool_calls=parser)


def render(tokenizer, req: ChatRequest) -> tuple[Sent, list[int], ToolCallParser | None, Constraint | None]:
    """The request rendered by the chat template and tokenised, its reply parser and its grammar."""
    messages = [m.as_template() for m in req.messages]
    try:
        text = tokenizer.apply_chat_template(messages, tools=req.tools, add_generation_prompt=True, tokenize=False)
    except Exception as exc:  # noqa: BLE001  a template refusing these messages is the client's error
        raise bad_request(f"the model's chat template cannot render these messages: {exc}", "messages") from None
    check_tools_render(tokenizer, messages, req.tools, text)  # tools the template leaves out: a 400, not a drop
    ids = list(tokenizer(text, add_special_tokens=False)["input_ids"])
    question = next((m["content"] for m in reversed(messages) if m["role"] == "user"), messages[-1]["content"])
    parser = ToolCallParser.for_request(tokenizer, req.tools, req.tool_choice, text)
    # response_format json, a forced tool call: a grammar
    constraint = of_request(req.tools, req.tool_choice, req.parallel_tool_calls, req.response_format, parser)
    options = req.options() if constraint is None else {**req.options(), "constraint": constraint.stored}
    return Sent([text], [question], messages, req.tools, options), ids, parser, constraint
