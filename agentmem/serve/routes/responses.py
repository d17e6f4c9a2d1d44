"""``POST /v1/responses``: the Responses API on the chat path. The request's ``instructions`` and ``input``
items become chat messages and its function tools chat tools (``responses_api.py``), rendered by the chat
template like a chat request (tools it cannot render refused the same way); each call is stored as one
chat invocation (``serve_calls.messages`` the messages as rendered), with the exact ids and log-probs. Its
``id`` is the invocation id.

``previous_response_id`` names an earlier response of this run: its messages (but its own ``instructions``,
which OpenAI does not carry over) and its reply (with its tool calls) come before this request's input; the
call then continues that call's episode (unless the client names one) with it as parent.

Streamed (``stream: true``), the events are OpenAI's: ``response.created``, ``response.in_progress``; for
text ``response.output_item.added`` (the message), ``response.content_part.added``, one
``response.output_text.delta`` per piece of text as the tokens are sampled (with their log-probs when
``include`` asks for ``message.output_text.logprobs``), then, once the call is stored,
``response.output_text.done``, ``response.content_part.done``, ``response.output_item.done``; per tool call
``response.output_item.added``, ``response.function_call_arguments.delta`` and ``.done``,
``response.output_item.done``; last ``response.completed`` (``response.incomplete`` when ``max_output_tokens``
cut the reply). A client gone before that has nothing stored.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import AsyncIterator
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, StreamingResponse

from agentmem.records import FinishReason
from agentmem.serve.bounds import INVOCATION_ID, check_id
from agentmem.serve.calls import Calls, Prepared, read_request, stream_error
from agentmem.serve.chat_template import check_tools_render
from agentmem.serve.constraints import Constraint, of_request, text_format
from agentmem.serve.formatting import Formatter, LiveText
from agentmem.serve.protocol import ApiError, ResponsesRequest, bad_request, refuse_unsupported_responses
from agentmem.serve.recorder import Sent
from agentmem.serve.responses_api import (
    assistant_message,
    call_items,
    chat_messages,
    chat_tools,
    event,
    message_item,
    output_items,
    response,
)
from agentmem.serve.routes import calls, episode
from agentmem.serve.sampler import Choice, Tokens
from agentmem.serve.tool_calls import ToolCallParser

router = APIRouter()


@router.post("/responses")
async def create_response(request: Request) -> Any:
    shared = calls(request)
    tok = shared.tokenizer
    req = await read_request(request, ResponsesRequest, refuse=refuse_unsupported_responses)
    shared.check_request(req)
    if req.n != 1:
        raise bad_request("a response has one output: send n 1 (chat completions take n)", "n")
    check_id(req.previous_response_id, INVOCATION_ID, "previous_response_id")
    prefix, follows = await _previous(shared, req.previous_response_id)
    # rendering and tokenizing a long input takes a while: off the event loop, so other requests go on
    sent, ids, parser, constraint = await asyncio.to_thread(render, tok, req, prefix)
    prep = await shared.prepare(request, req, episode(request), [ids], sent, "chat", follows=follows,
                                constraint=constraint)
    shape = Formatter(tok, shared.settings.model_name, None, True, req.logprobs)
    headers = {"X-Agentmem-Invocation": prep.planned.invocation_ids[0],
               "X-Agentmem-Episode": prep.planned.episode_ids[0]}
    if req.stream:
        return StreamingResponse(_stream(request, shared, req, prep, parser, shape), headers=headers,
                                 media_type="text/event-stream")
    [choice] = await asyncio.wrap_future(shared.sampler.submit(prep.job))
    await asyncio.to_thread(shared.store, prep, [choice])
    call_id = prep.planned.invocation_ids[0]
    reply = parser.parse(choice.text, f"{call_id}_0", cut(choice)) if parser is not None else None
    lps = shape._chat_logprobs(choice) if req.logprobs else None
    out = response(req, call_id, time.time(), output_items(call_id, choice, reply, lps), choice, len(ids),
                   reply is not None and reply.cut)
    return JSONResponse(out, headers=headers)


def render(tok, req: ResponsesRequest, prefix: list[dict[str, Any]]
           ) -> tuple[Sent, list[int], ToolCallParser | None, Constraint | None]:
    """The request as chat messages and tools, rendered by the chat template and tokenised; its reply parser
    and its grammar."""
    messages = chat_messages(req, prefix)
    tools = chat_tools(req.tools)
    try:
        text = tok.apply_chat_template(messages, tools=tools, add_generation_prompt=True, tokenize=False)
    except Exception as exc:  # noqa: BLE001  a template refusing these messages is the client's error
        raise bad_request(f"the model's chat template cannot render this input: {exc}", "input") from None
    check_tools_render(tok, messages, tools, text)
    ids = list(tok(text, add_special_tokens=False)["input_ids"])
    question = next((m["content"] for m in reversed(messages) if m["role"] == "user"), messages[-1]["content"])
    parser = ToolCallParser.for_request(tok, tools, req.tool_choice, text)
    constraint = of_request(tools, req.tool_choice, req.parallel_tool_calls, text_format(req.text), parser, "text")
    options = req.options() if constraint is None else {**req.options(), "constraint": constraint.stored}
    return Sent([text], [question], messages, tools, options), ids, parser, constraint


def cut(choice: Choice) -> bool:
    return choice.finish_reason is FinishReason.length


async def _previous(shared: Calls, previous_id: str | None) -> tuple[list[dict[str, Any]], tuple[str | None, str] | None]:
    """The conversation a ``previous_response_id`` continues, and (its episode when named, its id)."""
    if previous_id is None:
        return [], None
    found = await asyncio.to_thread(shared.recorder.previous, previous_id)
    if found is None:
        raise ApiError(404, f"Previous response with id '{previous_id}' not found.", param="previous_response_id",
                       code="previous_response_not_found")
    call, inv = found
    messages = list(call.messages or [])
    if (call.sampling or {}).get("instructions") and messages and messages[0]["role"] == "system":
        messages = messages[1:]  # instructions are not carried over
    parser = ToolCallParser.for_request(shared.tokenizer, call.tools, (call.sampling or {}).get("tool_choice"),
                                        inv.prompt_text or "")
    reply = (parser.parse(inv.output_text or "", f"{inv.id}_0", inv.finish_reason is FinishReason.length)
             if parser is not None else None)
    named = (call.client or {}).get("episode")
    return [*messages, assistant_message(inv.output_text or "", reply)], (None if named == inv.id else named, inv.id)


async def _stream(request: Request, shared: Calls, req: ResponsesRequest, prep: Prepared,
                  parser: ToolCallParser | None, shape: Formatter) -> AsyncIterator[str]:
    call_id, created, seq = prep.planned.invocation_ids[0], time.time(), itertools.count()
    prompt = prep.prompts[0]
    yield event("response.created", next(seq), response=response(req, call_id, created, [], None, len(prompt)))
    yield event("response.in_progress", next(seq), response=response(req, call_id, created, [], None, len(prompt)))
    item_id, where = f"msg_{call_id}", {"output_index": 0, "content_index": 0}
    live = LiveText(shared.tokenizer, prompt, prep.job.stops, parser.opener if parser is not None else None)
    held = parser is not None and parser.opener is None  # calls may begin anywhere: the text waits for the end
    opened, logged = False, 0  # whether the message item was announced; tokens whose log-probs went out

    def opening() -> list[str]:
        return [event("response.output_item.added", next(seq), output_index=0,
                      item=message_item(call_id, "", None, "in_progress")),
                event("response.content_part.added", next(seq), item_id=item_id, **where,
                      part={"type": "output_text", "text": "", "annotations": []})]

    def delta(text: str, so_far: Choice, upto: int) -> str:
        nonlocal logged
        lps = shape._chat_logprobs(so_far, logged, upto) if req.logprobs else []
        logged = upto
        return event("response.output_text.delta", next(seq), item_id=item_id, **where, delta=text, logprobs=lps)

    choice: Choice | None = None
    try:
        async for ev in shared.sampler.stream(prep.job):
            if isinstance(ev, Tokens):
                so_far, _, stop, piece = live.add(ev)
                if piece and not held:
                    if not opened:
                        for e in opening():
                            yield e
                        opened = True
                    yield delta(piece, so_far, stop)
            else:
                [choice] = ev
    except Exception as exc:  # noqa: BLE001  the stream has started: the error goes in it, nothing is stored
        err = stream_error(exc)
        yield event("error", next(seq), code=err.code, message=err.message, param=err.param)
        return
    assert choice is not None
    reply = parser.parse(choice.text, f"{call_id}_0", cut(choice)) if parser is not None else None
    calls_out = call_items(call_id, reply)
    text = choice.text if not calls_out else (reply.content if reply is not None else None)
    if text is not None:
        sent = live.sent if opened else ""
        rest = text[len(sent):] if text.startswith(sent) else ""
        if not opened:
            for e in opening():
                yield e
            opened = True
        if rest or logged < len(choice.output_ids):
            yield delta(rest, choice, len(choice.output_ids))
    if await request.is_disconnected():
        return  # the client is gone: its call is not stored
    try:
        await asyncio.to_thread(shared.store, prep, [choice])
    except Exception as exc:  # noqa: BLE001  e.g. the episode was rewarded meanwhile: the error goes in the stream
        err = stream_error(exc)
        yield event("error", next(seq), code=err.code, message=err.message, param=err.param)
        return
    lps = shape._chat_logprobs(choice) if req.logprobs else None
    items = output_items(call_id, choice, reply, lps)
    for index, item in enumerate(items):
        if item["type"] == "message":
            part = item["content"][0]
            yield event("response.output_text.done", next(seq), item_id=item_id, **where, text=part["text"],
                        logprobs=lps or [])
            yield event("response.content_part.done", next(seq), item_id=item_id, **where, part=part)
        else:
            yield event("response.output_item.added", next(seq), output_index=index,
                        item={**item, "arguments": "", "status": "in_progress"})
            yield event("response.function_call_arguments.delta", next(seq), item_id=item["id"], output_index=index,
                        delta=item["arguments"])
            yield event("response.function_call_arguments.done", next(seq), item_id=item["id"], output_index=index,
                        arguments=item["arguments"])
        yield event("response.output_item.done", next(seq), output_index=index, item=item)
    done = response(req, call_id, created, items, choice, len(prompt), reply is not None and reply.cut)
    kind = "response.completed" if done["status"] == "completed" else "response.incomplete"
    yield event(kind, next(seq), response=done)
