"""A served call's request as the episode page shows it (``serve_calls``: what the client sent to
``agentmem serve``): its messages, tools, sampling options and decoding constraint. Pure: a ``ServeCall`` in,
display values out, every value as the client sent it (JSON for anything that is not text)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from agentmem.records import ServeCall

CONSTRAINT_FIELDS = ("response_format", "text", "tool_choice")  # chat's, Responses', both APIs'


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
    options: list[tuple[str, str]]  # (field, JSON value) of every sampling field but a constraint's
    constraint: str | None  # what decoding was held to, in words; None: free sampling
    schema: str | None  # the constraint's JSON schema, as JSON


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


def constraint(sampling: dict[str, Any]) -> tuple[str | None, str | None, set[str]]:
    """(the constraint in words, its schema as JSON, the sampling fields it came from) from the OpenAI fields
    that constrain decoding: ``response_format`` (chat) or ``text.format`` (Responses) of type ``json_object``
    or ``json_schema``, and ``tool_choice`` ``required`` or a named function. ``text``, ``auto`` and ``none``
    constrain nothing: they stay among the options."""
    said: list[str] = []
    schema: str | None = None
    fields: set[str] = set()
    for field, fmt in (("response_format", sampling.get("response_format")),
                       ("text", (sampling.get("text") or {}).get("format") if isinstance(sampling.get("text"), dict)
                        else None)):
        if not isinstance(fmt, dict) or fmt.get("type") not in ("json_object", "json_schema"):
            continue
        fields.add(field)
        if fmt["type"] == "json_object":
            said.append("JSON object")
            continue
        spec = fmt.get("json_schema", fmt)  # chat nests it under json_schema; Responses puts it in the format
        said.append(f"JSON schema {spec.get('name', '')}".rstrip() + (" (strict)" if spec.get("strict") else ""))
        schema = dumps(spec.get("schema", {}))
    choice = sampling.get("tool_choice")
    if choice == "required":
        fields.add("tool_choice")
        said.append("a tool call (tool_choice required)")
    elif isinstance(choice, dict):
        fields.add("tool_choice")
        name = choice.get("function", choice).get("name")
        said.append(f"a call of {name} (tool_choice)")
    return ("; ".join(said) or None), schema, fields


def request(call: ServeCall) -> Request:
    said, schema, fields = constraint(call.sampling)
    options = [(k, dumps(v)) for k, v in call.sampling.items() if k not in fields]
    return Request([message(m) for m in call.messages or []], [tool(t) for t in call.tools or []], options,
                   said, schema)
