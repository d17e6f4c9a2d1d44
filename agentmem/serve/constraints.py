"""Structured output and forced tool calls as grammars (constrained decoding): pure request checking, no I/O.

A chat request's ``response_format`` (``json_object``, ``json_schema``) or forcing ``tool_choice`` (``required``, a
named function) becomes a ``Constraint``: a grammar in llguidance's Lark syntax (``SamplingParams.grammar``), which
the backend applies to the logits at every step (``backends.shaping``: the tokens it forbids get ``-inf`` before any
other option; on vLLM its ``guidance`` structured-output backend does the same), and the record of it that
``serve_calls.sampling`` stores under ``"constraint"`` (its kind, the schema or tool names, the grammar itself and
the llguidance version, so that replay can rebuild the mask the sampler applied).

JSON is emitted in one layout, the one ``json.dumps`` and chat templates' ``tojson`` write (``", "`` and ``": "``,
no other whitespace), so a reply has no whitespace to wander in, and object properties come in the schema's
order. A forced tool call is the chat template's own format, which the reply parser reads back (the Hermes
``<tool_call>\\n{"name": .., "arguments": ..}\\n</tool_call>`` of ``tool_calls.HERMES``): ``required`` allows one
call or more (one with ``parallel_tool_calls: false``), a named function exactly one call of it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import llguidance

from agentmem.serve.protocol import bad_request, check_schema
from agentmem.serve.tool_calls import ToolCallParser

# llguidance's JSON options: a fixed layout (see the module)
LAYOUT = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}
ANY_OBJECT: dict[str, Any] = {"type": "object"}


@dataclass(frozen=True)
class Constraint:
    """``grammar``: Lark text for llguidance; ``record``: what it enforces (kind, schema or tool names); ``param``: the
    request field that asked for it."""

    grammar: str
    record: dict[str, Any]
    param: str

    @property
    def stored(self) -> dict[str, Any]:
        """What ``serve_calls.sampling["constraint"]`` stores: the record, the grammar and the library that applied it
        (the masks of one grammar may differ between llguidance versions)."""
        return {**self.record, "grammar": self.grammar, "library": f"llguidance {llguidance.__version__}"}


def json_grammar(schema: dict[str, Any]) -> str:
    return "start: %json " + json.dumps({**schema, "x-guidance": LAYOUT})


def checked(grammar: str, param: str) -> str:
    """``grammar`` when llguidance compiles it, else the 400 naming ``param``."""
    try:
        error = llguidance.LLMatcher.validate_grammar(llguidance.LLMatcher.grammar_from_lark(grammar), None)
    except (ValueError, TypeError) as exc:
        error = str(exc)
    if error:
        raise bad_request(f"{param}: the schema cannot be enforced: {error.strip()}", param)
    return grammar


def response_format(value: dict[str, Any] | None, param: str = "response_format") -> Constraint | None:
    """The constraint of a chat ``response_format`` (None for text); ``param``: the field a 400 names."""
    kind = (value or {}).get("type", "text")
    if kind == "text":
        return None
    if kind == "json_object":
        return Constraint(checked(json_grammar(ANY_OBJECT), param), {"kind": "json_object"}, param)
    if kind == "json_schema":
        spec = (value or {}).get("json_schema")
        schema = spec.get("schema", ANY_OBJECT) if isinstance(spec, dict) else None
        if not isinstance(schema, dict):
            raise bad_request(f"{param}: json_schema needs a schema, a JSON schema object", param)
        try:
            check_schema(schema, f"{param}.json_schema.schema")
        except ValueError as err:
            raise bad_request(str(err), param) from None
        return Constraint(checked(json_grammar(schema), param), {"kind": "json_schema", "schema": schema}, param)
    raise bad_request(f"{param}: type {kind!r} is not supported: text, json_object or json_schema", param)


def forced_tool(tool_choice: Any) -> str | None:
    """The function a ``tool_choice`` names (chat's ``{"type": "function", "function": {"name": ..}}`` or the
    Responses API's ``{"type": "function", "name": ..}``), ``"*"`` for ``required``, None when no call is forced."""
    if tool_choice in (None, "auto", "none"):
        return None
    if tool_choice == "required":
        return "*"
    if isinstance(tool_choice, dict) and tool_choice.get("type") == "function":
        function = tool_choice.get("function")
        name = function.get("name") if isinstance(function, dict) else tool_choice.get("name")
        if isinstance(name, str) and name:
            return name
    raise bad_request("tool_choice is auto, none, required, or {\"type\": \"function\", \"function\": {\"name\": ..}}",
                      "tool_choice")


def tool_call(tools: list[dict[str, Any]] | None, tool_choice: Any, parallel: bool | None,
              parser: ToolCallParser | None) -> Constraint | None:
    """The constraint of a ``tool_choice`` that forces a call (None when it does not). ``parser``: the request's
    tool-call parser; the grammar writes the calls it reads."""
    forced = forced_tool(tool_choice)
    if forced is None:
        if parallel is False and tools and tool_choice != "none":
            raise bad_request("parallel_tool_calls: false is only enforced when tool_choice forces a call "
                              "(required or a named function)", "parallel_tool_calls", code="unsupported_parameter")
        return None
    functions = [t.get("function") or {} for t in tools or [] if t.get("type") == "function"]
    if not functions:
        raise bad_request("tool_choice forces a tool call but the request has no function tools", "tool_choice")
    if forced != "*":
        functions = [f for f in functions if f.get("name") == forced]
        if not functions:
            raise bad_request(f"tool_choice names {forced!r}, which is not among the tools", "tool_choice")
    if parser is None or parser.opener is None:
        raise bad_request("tool_choice required or a named function needs a chat template whose tool-call format "
                          "agentmem knows (the Hermes <tool_call> format: serve with --chat-template chatml_tools)",
                          "tool_choice", code="unsupported_parameter")
    calls = [{"type": "object", "properties": {"name": {"const": f.get("name")},
                                               "arguments": f.get("parameters") or ANY_OBJECT},
              "required": ["name", "arguments"], "additionalProperties": False} for f in functions]
    body = calls[0] if len(calls) == 1 else {"anyOf": calls}
    many = forced == "*" and parallel is not False
    grammar = "\n".join([
        'start: call ("\\n" call)*' if many else "start: call",
        'call: "<tool_call>\\n" body "\\n</tool_call>"',
        "body: %json " + json.dumps({**body, "x-guidance": LAYOUT}),
    ])
    record = {"kind": "tool_call", "tools": [f.get("name") for f in functions], "calls": "one_or_more" if many else "one"}
    return Constraint(checked(grammar, "tool_choice"), record, "tool_choice")


def of_request(tools: list[dict[str, Any]] | None, tool_choice: Any, parallel: bool | None,
               output: dict[str, Any] | None, parser: ToolCallParser | None,
               output_param: str = "response_format") -> Constraint | None:
    """A request's constraint: its forced tool call (``tools`` as chat tools) or its JSON output (``output``: a chat
    ``response_format``, from the field ``output_param``), never both."""
    call = tool_call(tools, tool_choice, parallel, parser)
    json_output = response_format(output, output_param)
    if call is not None and json_output is not None:
        raise bad_request(f"{output_param} json_object/json_schema and a tool_choice that forces a call cannot be "
                          "combined: the reply is either the JSON or the call", output_param)
    return call or json_output


def text_format(text: dict[str, Any] | None) -> dict[str, Any] | None:
    """The Responses API's ``text.format`` as a chat ``response_format`` (its json_schema fields are not nested)."""
    fmt = (text or {}).get("format")
    if not isinstance(fmt, dict) or fmt.get("type") != "json_schema":
        return fmt
    return {"type": "json_schema", "json_schema": {k: v for k, v in fmt.items() if k != "type"}}
