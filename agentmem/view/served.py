"""A served call's request as the episode page shows it (``serve_calls``: what the client sent to
``agentmem serve``): its messages, tools, sampling options and the decoding constraint the server applied
(``sampling["constraint"]``, ``serve.constraints``). Pure: a ``ServeCall`` in, display values out, every value as
stored (JSON for anything that is not text)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from agentmem.records import ServeCall


@dataclass(frozen=True)
class Message:
    role: str
    text: str  # the content as text (parts joined), "" for none
    calls: list[str]  # an assistant's tool calls: ``name {arguments as JSON}``
    call_id: str | None  # a tool result's ``tool_call_id``


@dataclass(frozen=True)
class Tool:
    name: str
    description: str
    parameters: str  # JSON


@dataclass(frozen=True)
class Request:
    messages: list[Message]
    tools: list[Tool]
    options: list[tuple[str, str]]  # (field, JSON value) of every sampling field but the constraint
    constraint: str | None  # what decoding was held to, in words; None: sampled freely
    schema: str | None  # a json_schema constraint's schema, as JSON
    grammar: str | None  # the grammar the sampler applied (llguidance's Lark text)


def dumps(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, sort_keys=False)


def _text(content: Any) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # content parts: [{"type": "text", "text": ..}, ..]
        return "".join(p["text"] if isinstance(p, dict) and isinstance(p.get("text"), str) else dumps(p)
                       for p in content)
    return dumps(content)


def _call(call: dict[str, Any]) -> str:
    function = call.get("function", call)
    arguments = function.get("arguments")
    if isinstance(arguments, str):  # as OpenAI clients send it: a JSON string
        try:
            arguments = json.loads(arguments)
        except json.JSONDecodeError:
            return f"{function.get('name')} {arguments}"
    return f"{function.get('name')} {dumps(arguments)}"


def message(m: dict[str, Any]) -> Message:
    return Message(str(m.get("role", "")), _text(m.get("content")), [_call(c) for c in m.get("tool_calls") or []],
                   m.get("tool_call_id"))


def tool(t: dict[str, Any]) -> Tool:
    function = t.get("function", t)  # a chat tool ({"type": "function", "function": {..}}) or a bare one
    return Tool(str(function.get("name", "")), str(function.get("description") or ""),
                dumps(function.get("parameters", {})))


def constraint(record: dict[str, Any] | None) -> str | None:
    """The constraint ``serve_calls.sampling["constraint"]`` records, in words (None: sampled freely)."""
    if not record:
        return None
    if record.get("kind") == "tool_call":
        names = ", ".join(record.get("tools") or [])
        return f"one or more tool calls of {names}" if record.get("calls") == "one_or_more" else f"a call of {names}"
    return {"json_schema": "JSON schema", "json_object": "JSON object"}.get(record.get("kind", ""), dumps(record))


def request(call: ServeCall) -> Request:
    record = call.sampling.get("constraint")
    schema = record.get("schema") if record and record.get("kind") == "json_schema" else None
    return Request([message(m) for m in call.messages or []], [tool(t) for t in call.tools or []],
                   [(k, dumps(v)) for k, v in call.sampling.items() if k != "constraint"], constraint(record),
                   None if schema is None else dumps(schema), record.get("grammar") if record else None)
