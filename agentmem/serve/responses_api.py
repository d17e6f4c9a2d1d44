"""The Responses API's shapes and chat messages, both ways: pure conversion, no I/O.

- ``chat_messages``: a request's ``instructions`` and ``input`` items as chat messages (what the chat template
  renders and ``serve_calls.messages`` stores): ``instructions`` a leading system message; a message item
  (``role`` user, system, developer (read as system) or assistant; ``content`` a string or ``input_text`` /
  ``output_text`` parts) a message; consecutive ``function_call`` items one assistant message's ``tool_calls``
  (joined to the assistant message just before them); a ``function_call_output`` a ``tool`` message.
- ``chat_tools``: function tools (``{"type": "function", "name", "description", "parameters"}``) as chat tools.
- ``output_items``: one sampled reply as output items: a ``message`` with one ``output_text`` (its token
  log-probs when asked), and one ``function_call`` per parsed tool call (``call_id`` ``call_{id}_0_{k}``, as
  chat tool calls are named).
- ``response``: the ``Response`` object; ``status`` ``completed``, or ``incomplete``
  (``incomplete_details.reason`` ``max_output_tokens``) when the output limit cut the reply.
"""

from __future__ import annotations

import json
from typing import Any

from agentmem.records import FinishReason
from agentmem.serve.protocol import ResponsesRequest, _template_call, bad_request
from agentmem.serve.sampler import Choice
from agentmem.serve.tool_calls import Reply

ROLES = {"user": "user", "system": "system", "developer": "system", "assistant": "assistant"}


def _text(content: Any, where: str) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for part in content:
            if not isinstance(part, dict) or part.get("type") not in ("input_text", "output_text", "text"):
                raise bad_request(f"{where}: only text content parts are supported", "input")
            parts.append(str(part.get("text", "")))
        return "".join(parts)
    raise bad_request(f"{where}: content must be a string or a list of text parts", "input")


def chat_messages(req: ResponsesRequest, prefix: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``prefix`` (the previous response's conversation), then the request's instructions and input."""
    out: list[dict[str, Any]] = []
    if req.instructions:
        out.append({"role": "system", "content": req.instructions})
    out += prefix
    items = [{"role": "user", "content": req.input}] if isinstance(req.input, str) else list(req.input or [])
    for k, item in enumerate(items):
        kind, where = item.get("type", "message"), f"input[{k}]"
        for key in ("type", "role", "call_id", "name", "arguments"):  # each a string when given
            if item.get(key) is not None and not isinstance(item[key], str):
                raise bad_request(f"{where}.{key}: a string, got {type(item[key]).__name__}", f"input.{k}.{key}")
        if kind == "message":
            role = ROLES.get(item.get("role", ""))
            if role is None:
                raise bad_request(f"{where}: unknown role {item.get('role')!r}", "input")
            out.append({"role": role, "content": _text(item.get("content", ""), where)})
        elif kind == "function_call":
            if not item.get("name"):
                raise bad_request(f"{where}: a function_call names its function", f"input.{k}.name")
            call = _template_call({"id": item.get("call_id"), "type": "function",
                                   "function": {"name": item.get("name"), "arguments": item.get("arguments", "{}")}})
            if out and out[-1]["role"] == "assistant":
                out[-1].setdefault("tool_calls", []).append(call)
            else:
                out.append({"role": "assistant", "content": "", "tool_calls": [call]})
        elif kind == "function_call_output":
            out.append({"role": "tool", "tool_call_id": item.get("call_id"),
                        "content": _text(item.get("output", ""), where)})
        elif kind == "reasoning":
            continue  # the served model does not reason: a reasoning item (from another model) has nothing to render
        else:
            raise bad_request(f"{where}: input items of type {kind!r} are not supported", "input")
    if not out or all(m["role"] == "system" for m in out):
        raise bad_request("input is empty: send a string or at least one message", "input")
    return out


def chat_tools(tools: list[dict[str, Any]] | None) -> list[dict[str, Any]] | None:
    if not tools:
        return None
    out = []
    for k, tool in enumerate(tools):
        if tool.get("type") != "function" or not tool.get("name"):
            raise bad_request(f"tools[{k}]: only function tools are supported (type {tool.get('type')!r})", "tools")
        function = {key: tool[key] for key in ("name", "description", "parameters") if tool.get(key) is not None}
        out.append({"type": "function", "function": function})
    return out


def assistant_message(text: str, reply: Reply | None) -> dict[str, Any]:
    """A stored reply as the assistant message that continues its conversation."""
    if reply is None or not reply.tool_calls:
        return {"role": "assistant", "content": text}
    return {"role": "assistant", "content": reply.content or "",
            "tool_calls": [_template_call(c) for c in reply.tool_calls]}


def message_item(call_id: str, text: str, logprobs: list[dict[str, Any]] | None, status: str = "completed") -> dict:
    part: dict[str, Any] = {"type": "output_text", "text": text, "annotations": []}
    if logprobs is not None:
        part["logprobs"] = logprobs
    return {"type": "message", "id": f"msg_{call_id}", "status": status, "role": "assistant",
            "content": [part] if status == "completed" else []}


def call_items(call_id: str, reply: Reply | None) -> list[dict[str, Any]]:
    return [{"type": "function_call", "id": f"fc_{call_id}_{k}", "call_id": c["id"], "name": c["function"]["name"],
             "arguments": c["function"]["arguments"], "status": "completed"}
            for k, c in enumerate(reply.tool_calls if reply is not None else [])]


def output_items(call_id: str, choice: Choice, reply: Reply | None,
                 logprobs: list[dict[str, Any]] | None) -> list[dict[str, Any]]:
    calls = call_items(call_id, reply)
    text = choice.text if not calls else (reply.content if reply is not None else None)
    return ([message_item(call_id, text, logprobs)] if text is not None else []) + calls


def response(req: ResponsesRequest, call_id: str, created: float, output: list[dict[str, Any]],
             choice: Choice | None, prompt_tokens: int, cut_calls: bool = False) -> dict[str, Any]:
    """The ``Response`` object: in progress (``choice`` None) or done; ``cut_calls``: its calls are those a forced
    reply completed before the output limit cut it (``incomplete``, as a cut text reply)."""
    status, incomplete = "in_progress", None
    if choice is not None:
        # cut by the output limit: a reply of text, or a forced one whose last call the cut dropped (its calls
        # before the cut are in ``output``)
        cut = choice.finish_reason is FinishReason.length and (
            not any(i["type"] == "function_call" for i in output) or cut_calls)
        status = "incomplete" if cut else "completed"
        incomplete = {"reason": "max_output_tokens"} if cut else None
    out: dict[str, Any] = {
        "id": call_id, "object": "response", "created_at": created, "status": status, "error": None,
        "incomplete_details": incomplete, "instructions": req.instructions, "max_output_tokens": req.max_output_tokens,
        "model": req.model, "output": output, "parallel_tool_calls": req.parallel_tool_calls is not False,
        "previous_response_id": req.previous_response_id, "reasoning": None, "store": True,
        "temperature": req.temperature, "top_p": req.top_p, "text": {"format": (req.text or {}).get("format") or {"type": "text"}},
        "tool_choice": req.tool_choice or "auto", "tools": req.tools or [], "truncation": "disabled",
        "top_logprobs": req.top_logprobs, "metadata": req.metadata or {}, "user": req.user, "usage": None,
    }
    if choice is not None:
        out["usage"] = {"input_tokens": prompt_tokens, "input_tokens_details": {"cached_tokens": 0},
                        "output_tokens": len(choice.output_ids), "output_tokens_details": {"reasoning_tokens": 0},
                        "total_tokens": prompt_tokens + len(choice.output_ids)}
    return out


def event(kind: str, seq: int, **fields: Any) -> str:
    """One server-sent event of a streamed response."""
    return f"event: {kind}\ndata: {json.dumps({'type': kind, 'sequence_number': seq, **fields})}\n\n"
