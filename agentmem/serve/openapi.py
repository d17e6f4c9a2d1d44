"""The OpenAPI 3.1 document of ``agentmem serve`` (``GET /openapi.json``): every route, its path parameters and
headers, and its request body: pure data, no I/O.

The bodies are the request models' JSON schemas (``protocol.py``), with the fields those models keep loose (a
message's content parts and tool calls, the tools, ``tool_choice``, ``response_format``, the Responses input
items, ``metadata``) given their OpenAI shapes, so that the document says what the server accepts and a client or
a property-based test (``agentmem.testing.fuzz``) can build requests from it. The routes read their bodies
themselves (``calls.read_request``), so FastAPI's own document would hold none of this.
"""

from __future__ import annotations

import copy
from typing import Any

from pydantic import BaseModel

from agentmem.serve.protocol import (
    FUNCTION_NAME,
    ChatRequest,
    CompletionRequest,
    PrivilegedRequest,
    ResponsesRequest,
    RewardRequest,
)
from store.bounds import LIMITS

REF = "#/components/schemas/{model}"


def _nullable(schema: dict[str, Any]) -> dict[str, Any]:
    return {"anyOf": [schema, {"type": "null"}]}


def _string(max_length: int | None = None, **extra: Any) -> dict[str, Any]:
    return {"type": "string", **({"maxLength": max_length} if max_length else {}), **extra}


# A JSON schema: what a tool's parameters and a json_schema response format hold (checked against the metaschema).
JSON_SCHEMA: dict[str, Any] = {"type": "object", "description": "A JSON schema (the metaschema checks it); a tool's "
                                                                "parameters describe an object"}
FUNCTION: dict[str, Any] = {
    "type": "object", "required": ["name"],
    "properties": {"name": _string(pattern=f"^{FUNCTION_NAME.pattern}$"), "description": _string(),
                   "parameters": JSON_SCHEMA, "strict": {"type": "boolean"}}}
SHAPES: dict[str, dict[str, Any]] = {
    "TextPart": {"type": "object", "required": ["type", "text"],
                 "properties": {"type": {"const": "text"}, "text": _string()}},
    "ToolCall": {"type": "object", "required": ["id", "type", "function"],
                 "properties": {"id": _string(), "type": {"const": "function"},
                                "function": {"type": "object", "required": ["name", "arguments"],
                                             "properties": {"name": _string(), "arguments": _string()}}}},
    "ChatTool": {"type": "object", "required": ["type", "function"],
                 "properties": {"type": {"const": "function"}, "function": FUNCTION}},
    "ResponsesTool": {"type": "object", "required": ["type", "name"],
                      "properties": {"type": {"const": "function"}, **FUNCTION["properties"]}},
    "ToolChoice": {"anyOf": [{"enum": ["auto", "none", "required"]},
                             {"type": "object", "required": ["type", "function"],
                              "properties": {"type": {"const": "function"},
                                             "function": {"type": "object", "required": ["name"],
                                                          "properties": {"name": _string()}}}}]},
    "ResponseFormat": {"anyOf": [
        {"type": "object", "required": ["type"], "properties": {"type": {"enum": ["text", "json_object"]}}},
        {"type": "object", "required": ["type", "json_schema"],
         "properties": {"type": {"const": "json_schema"},
                        "json_schema": {"type": "object", "required": ["name"],
                                        "properties": {"name": _string(), "schema": JSON_SCHEMA,
                                                       "strict": {"type": "boolean"}}}}}]},
    "Metadata": {"type": "object", "additionalProperties": True, "properties": {
        "episode": _string(LIMITS["episodes.task_id"]), "task": _string(LIMITS["episodes.task_id"]),
        "kind": _string(LIMITS["invocations.kind"]), "agentmem_reopen": _string()}},
    "InputItem": {"anyOf": [
        {"type": "object", "required": ["role", "content"],
         "properties": {"type": {"const": "message"}, "role": {"enum": ["user", "system", "developer", "assistant"]},
                        "content": {"anyOf": [_string(), {"type": "array", "items": {
                            "type": "object", "required": ["type", "text"],
                            "properties": {"type": {"enum": ["input_text", "output_text"]}, "text": _string()}}}]}}},
        {"type": "object", "required": ["type", "call_id", "name", "arguments"],
         "properties": {"type": {"const": "function_call"}, "call_id": _string(), "name": _string(),
                        "arguments": _string()}},
        {"type": "object", "required": ["type", "call_id", "output"],
         "properties": {"type": {"const": "function_call_output"}, "call_id": _string(), "output": _string()}}]},
}


def _ref(name: str) -> dict[str, Any]:
    return {"$ref": REF.format(model=name)}


def _message(roles: list[str], content: dict[str, Any], required: tuple[str, ...] = ("role", "content"),
             **more: dict[str, Any]) -> dict[str, Any]:
    return {"type": "object", "required": list(required),
            "properties": {"role": {"enum": roles}, "content": content, "name": _string(), **more}}


TEXT = {"anyOf": [_string(), {"type": "array", "items": _ref("TextPart")}]}
CALLS = {"type": "array", "items": _ref("ToolCall"), "minItems": 1}
# OpenAI's messages, one shape per role: content is text (a string or text parts), null only beside an assistant's
# tool calls
SHAPES["ChatMessage"] = {"anyOf": [
    _message(["system", "developer", "user"], TEXT),
    _message(["assistant"], TEXT, tool_calls=CALLS),
    _message(["assistant"], {"anyOf": [*TEXT["anyOf"], {"type": "null"}]}, ("role", "tool_calls"), tool_calls=CALLS),
    _message(["tool"], TEXT, ("role", "content", "tool_call_id"), tool_call_id=_string())]}


# per model, the fields given their OpenAI shapes (the models keep them loose and check them in validators)
FIELDS: dict[str, dict[str, dict[str, Any]]] = {
    "ChatRequest": {"tools": _nullable({"type": "array", "items": _ref("ChatTool")}),
                    "tool_choice": _nullable(_ref("ToolChoice")),
                    "response_format": _nullable(_ref("ResponseFormat")),
                    "metadata": _nullable(_ref("Metadata"))},
    "CompletionRequest": {"metadata": _nullable(_ref("Metadata"))},
    "ResponsesRequest": {"tools": _nullable({"type": "array", "items": _ref("ResponsesTool")}),
                         "tool_choice": _nullable(_ref("ToolChoice")),
                         "input": _nullable({"anyOf": [_string(), {"type": "array", "items": _ref("InputItem"),
                                                                   "minItems": 1}]}),
                         "text": _nullable({"type": "object", "properties": {"format": _ref("ResponseFormat")}}),
                         "include": _nullable({"type": "array",
                                               "items": {"enum": ["message.output_text.logprobs"]}}),
                         "metadata": _nullable(_ref("Metadata"))},
}
MODELS: tuple[type[BaseModel], ...] = (ChatRequest, CompletionRequest, ResponsesRequest, RewardRequest,
                                       PrivilegedRequest)
HEADERS = {
    "X-Agentmem-Episode": ("the episode of the call (else the path's, else metadata.episode)",
                           LIMITS["episodes.task_id"]),
    "X-Agentmem-Task": ("the episode's task (a GRPO group)", LIMITS["episodes.task_id"]),
    "X-Agentmem-Kind": ("the call's kind", LIMITS["invocations.kind"]),
    "X-Agentmem-Parent": ("the stored call this one continues", LIMITS["invocations.id"]),
    "X-Agentmem-Reopen": ("true: continue an episode already rewarded", None),
}


def _components() -> dict[str, Any]:
    schemas: dict[str, Any] = copy.deepcopy(SHAPES)
    for model in MODELS:
        schema = model.model_json_schema(ref_template=REF)
        schemas.update({k: v for k, v in schema.pop("$defs", {}).items() if k not in SHAPES})
        schemas[model.__name__] = schema
    for name, fields in FIELDS.items():
        for field, shape in fields.items():
            schemas[name]["properties"][field] = {**shape, "title": schemas[name]["properties"][field].get("title")}
    schemas["Error"] = {"type": "object", "required": ["error"], "properties": {"error": {
        "type": "object", "required": ["message", "type", "param", "code"],
        "properties": {"message": _string(), "type": _string(), "param": _nullable(_string()),
                       "code": _nullable(_string())}}}}
    return schemas


def _path(name: str, max_length: int) -> dict[str, Any]:
    return {"name": name, "in": "path", "required": True, "schema": _string(max_length)}


def _operation(summary: str, body: str | None = None, params: list[dict[str, Any]] | None = None,
               headers: bool = False) -> dict[str, Any]:
    op: dict[str, Any] = {"summary": summary, "parameters": list(params or []), "responses": {
        "200": {"description": "OK"},
        "default": {"description": "An error", "content": {"application/json": {"schema": _ref("Error")}}}}}
    if headers:
        op["parameters"] += [{"name": h, "in": "header", "required": False, "description": why,
                              "schema": _string(limit)} for h, (why, limit) in HEADERS.items()]
    if body is not None:
        op["requestBody"] = {"required": True, "content": {"application/json": {"schema": _ref(body)}}}
    return op


def openapi() -> dict[str, Any]:
    """The document: OpenAPI 3.1, whose schemas are JSON Schema 2020-12."""
    episode = _path("episode", LIMITS["episodes.task_id"])
    paths: dict[str, Any] = {"/health": {"get": _operation("The server's status and its run")}}
    routes = {"/chat/completions": ("post", "A chat completion, stored as an invocation", "ChatRequest"),
              "/completions": ("post", "A text completion, stored as an invocation", "CompletionRequest"),
              "/responses": ("post", "A response (the Responses API), stored as a chat invocation",
                             "ResponsesRequest"),
              "/models": ("get", "The served model", None)}
    for prefix, params in (("/v1", []), ("/episodes/{episode}/v1", [episode])):
        for route, (method, summary, body) in routes.items():
            paths[prefix + route] = {method: _operation(summary, body, params, headers=body is not None)}
    paths["/agentmem/episodes/{episode}/reward"] = {"post": _operation("Close an episode with its outcome",
                                                                       "RewardRequest", [episode])}
    paths["/agentmem/episodes/{episode}/privileged"] = {"post": _operation("An episode's privileged context",
                                                                           "PrivilegedRequest", [episode])}
    paths["/agentmem/episodes/{episode}"] = {"get": _operation("An episode of this run and its calls",
                                                               params=[episode])}
    paths["/agentmem/runs/{run}/episodes"] = {"get": _operation(
        "A run's episodes", params=[_path("run", LIMITS["runs.id"])])}
    return {"openapi": "3.1.0", "info": {"title": "agentmem serve", "version": "1"},
            "security": [{}, {"bearer": []}],
            "components": {"schemas": _components(),
                           "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}}},
            "paths": paths}
