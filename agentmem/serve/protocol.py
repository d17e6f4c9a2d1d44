"""The OpenAI request bodies the server accepts, and the error bodies it answers with.

Every option is either applied and recorded, or refused: a request field the server does not apply gets a
400 that names it (``param``), unless its value is the neutral one (``REFUSED``: e.g. ``response_format``
``{"type": "text"}``), and a field the server does not know gets a 400 naming it too. What a call is stored
with (``serve_calls.sampling``) is ``options()``: the fields the client gave, as given, but the model, the
messages or prompt, and the tools (stored beside them); ``max_tokens`` holds the output limit whichever of
``max_tokens`` and ``max_completion_tokens`` set it, ``stop`` a list, and ``n`` is always there.
An ``ApiError`` carries the HTTP status and the ``{"error": {"message", "type", "param", "code"}}`` body
an OpenAI client expects (the ``openai`` package raises ``BadRequestError`` for 400,
``AuthenticationError`` for 401, ``NotFoundError`` for 404, ``ConflictError`` for 409).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any, Literal

import jsonschema
from pydantic import BaseModel, ConfigDict, Field, FiniteFloat, field_validator, model_validator

from agentmem.backends.types import SamplingParams
from agentmem.errors import AgentmemError
from store.bounds import LIMITS, UNIT_METRICS

MAX_TOP_LOGPROBS = 20
GREEDY_BELOW = 1e-5  # vLLM's _SAMPLING_EPS: a lower temperature samples greedily
MIN_REPETITION_PENALTY = 0.01
# a seed is a signed 64-bit integer (OpenAI's, and what torch's and vLLM's generators take)
SEED_RANGE = (-(2**63), 2**63 - 1)
# OpenAI's rule for a function's name
FUNCTION_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")


class ApiError(AgentmemError):
    """A request the server refuses: ``status`` and the OpenAI error fields."""

    def __init__(self, status: int, message: str, *, type: str = "invalid_request_error", param: str | None = None,
                 code: str | None = None):
        super().__init__(message)
        self.status, self.message, self.type, self.param, self.code = status, message, type, param, code

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


def bad_request(message: str, param: str | None = None, code: str | None = None) -> ApiError:
    return ApiError(400, message, param=param, code=code)


def server_error(exc: BaseException) -> ApiError:
    """The 500 of an unexpected failure: its type and the first line of its message, never more (a database
    error's later lines hold the SQL and its bound parameters: the client's data and the schema)."""
    first = (str(exc).strip().splitlines() or [""])[0][:200]
    return ApiError(500, f"the server failed on this call: {type(exc).__name__}: {first}", type="server_error")


class _Body(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)


def _neutral(*values: Any) -> Callable[[Any], bool]:
    return lambda value: value in values


# Fields the server does not apply: refused (400 naming the field) unless null or neutral. Value: (neutral
# test, why it is refused).
REFUSED: dict[str, tuple[Callable[[Any], bool], str]] = {
    "store": (_neutral(True), "store: false is not supported: agentmem serve stores every call"),
    "modalities": (_neutral(["text"]), "only text output is supported"),
    "audio": (_neutral(), "audio output is not supported"),
    "prediction": (_neutral(), "predicted outputs are not supported"),
    "reasoning_effort": (_neutral(), "reasoning_effort is not supported: the served model has no reasoning "
                         "setting"),
    "verbosity": (_neutral(), "verbosity is not supported"),
    "web_search_options": (_neutral(), "web search is not supported"),
    "moderation": (_neutral(), "moderation is not supported"),
    "functions": (_neutral(), "functions is not supported: send tools"),
    "function_call": (_neutral(), "function_call is not supported: send tools and tool_choice"),
    "best_of": (_neutral(1), "best_of > 1 is not supported: send n and pick"),
    "suffix": (_neutral(""), "suffix (insertion) is not supported"),
    "echo": (_neutral(False), "echo: true is not supported"),
}


def refuse_unsupported(body: dict[str, Any]) -> None:
    """The 400 for the first field of ``body`` the server does not apply and whose value is not neutral."""
    for name, (neutral, why) in REFUSED.items():
        if body.get(name) is not None and not neutral(body[name]):
            raise bad_request(why, name, code="unsupported_parameter")


class _Sampling(BaseModel):
    """The fields both endpoints share (OpenAI defaults: temperature 1, top_p 1, n 1; vLLM's top_k, min_p
    and repetition_penalty, off by default). Unknown fields are refused."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    model: str
    n: int = Field(1, ge=1)
    temperature: float | None = Field(None, ge=0, le=2)
    top_p: float | None = Field(None, gt=0, le=1)
    max_tokens: int | None = Field(None, ge=1)
    stop: str | list[str] | None = None
    seed: int | None = Field(None, ge=SEED_RANGE[0], le=SEED_RANGE[1])
    stream: bool = False
    stream_options: dict[str, Any] | None = None
    metadata: dict[str, Any] | None = None
    user: str | None = None
    presence_penalty: float | None = Field(None, ge=-2, le=2)
    frequency_penalty: float | None = Field(None, ge=-2, le=2)
    logit_bias: dict[str, float] | None = None
    top_k: int | None = Field(None, ge=-1)  # -1 and 0: off (vLLM)
    min_p: float | None = Field(None, ge=0, le=1)
    # at least 0.01: a smaller penalty divides a logit past float32's range (then no distribution is left)
    repetition_penalty: float | None = Field(None, ge=MIN_REPETITION_PENALTY, le=2)
    return_token_ids: bool = False  # vLLM's flag: the response carries the prompt's and each choice's ids
    # accepted as neutral (REFUSED checks their values before parsing)
    store: bool | None = None
    best_of: int | None = None
    echo: bool | None = None
    suffix: str | None = None

    @field_validator("logit_bias")
    @classmethod
    def _bias(cls, value: dict[str, float] | None) -> dict[str, float] | None:
        for key, bias in (value or {}).items():
            if not (key.isascii() and key.isdigit()):
                raise ValueError(f"keys are token ids (as strings), got {key!r}")
            if not -100 <= bias <= 100:
                raise ValueError(f"biases are in [-100, 100], got {bias}")
        return value

    @field_validator("stop")
    @classmethod
    def _stops(cls, value: str | list[str] | None) -> str | list[str] | None:
        stops = [value] if isinstance(value, str) else (value or [])
        if len(stops) > 4 or any(not s for s in stops):
            raise ValueError("stop takes at most 4 non-empty strings")
        return value

    @property
    def stops(self) -> list[str]:
        return [self.stop] if isinstance(self.stop, str) else list(self.stop or [])

    @property
    def output_limit(self) -> int | None:
        return self.max_tokens

    @property
    def include_usage(self) -> bool:
        return bool((self.stream_options or {}).get("include_usage"))

    def params(self, max_new_tokens: int) -> SamplingParams:
        """The sampling the backend applies: a temperature below ``GREEDY_BELOW`` is greedy, as vLLM takes it (the
        logits divided by it would leave float32's range)."""
        temperature = 1.0 if self.temperature is None else self.temperature
        return SamplingParams(
            temperature=0.0 if temperature < GREEDY_BELOW else temperature,
            top_p=1.0 if self.top_p is None else self.top_p, max_new_tokens=max_new_tokens, seed=self.seed,
            top_k=max(self.top_k or 0, 0), min_p=self.min_p or 0.0,
            repetition_penalty=1.0 if self.repetition_penalty is None else self.repetition_penalty,
            presence_penalty=self.presence_penalty or 0.0, frequency_penalty=self.frequency_penalty or 0.0,
            logit_bias=tuple(sorted((int(k), float(v)) for k, v in (self.logit_bias or {}).items())))

    def options(self) -> dict[str, Any]:
        """The options as the client gave them, as ``serve_calls.sampling`` stores them (see the module)."""
        given = self.model_dump(mode="json", exclude_unset=True, exclude_none=True,
                                exclude={"model", "messages", "prompt", "tools", "max_completion_tokens",
                                         "return_token_ids"})
        given["n"] = self.n
        given.pop("max_tokens", None)
        if self.output_limit is not None:
            given["max_tokens"] = self.output_limit
        if self.stops:
            given["stop"] = self.stops
        return given


class ChatMessage(_Body):
    """A chat message as OpenAI takes it: a known role; text content (a string or text parts), which only an
    assistant message with tool calls may leave out (null); an assistant's ``tool_calls`` as OpenAI writes them
    (``{"id", "type": "function", "function": {"name", "arguments"}}``)."""

    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[dict[str, Any]] | None = None
    name: str | None = None
    tool_calls: list[dict[str, Any]] | None = None
    tool_call_id: str | None = None

    @field_validator("content")
    @classmethod
    def _text_parts(cls, value: str | list[dict[str, Any]] | None) -> str | list[dict[str, Any]] | None:
        for k, part in enumerate(value if isinstance(value, list) else []):
            if part.get("type") != "text" or not isinstance(part.get("text"), str):
                raise ValueError(f"{k}: only text parts are supported ({{\"type\": \"text\", \"text\": "
                                 f"STRING}}), got type {part.get('type')!r}")
        return value

    @field_validator("tool_calls")
    @classmethod
    def _calls(cls, value: list[dict[str, Any]] | None) -> list[dict[str, Any]] | None:
        for k, call in enumerate(value or []):
            function = call.get("function")
            if call.get("type", "function") != "function" or not isinstance(function, dict):
                raise ValueError(f"{k}: a call is {{\"type\": \"function\", \"function\": {{\"name\", "
                                 "\"arguments\"}}")
            if not isinstance(function.get("name"), str) or not isinstance(function.get("arguments", ""), str | dict):
                raise ValueError(f"{k}.function: name is a string and arguments a JSON string")
        return value

    @model_validator(mode="after")
    def _has_content(self) -> ChatMessage:
        if self.content is None and not (self.role == "assistant" and self.tool_calls):
            raise ValueError(f"content: a {self.role} message needs content (only an assistant message with "
                             "tool_calls may leave it out)")
        if self.tool_calls is not None and self.role != "assistant":
            raise ValueError(f"tool_calls: only an assistant message makes tool calls, not a {self.role} message")
        return self

    def as_template(self) -> dict[str, Any]:
        """The message as a chat template reads it: text parts joined into one string."""
        content = self.content
        if isinstance(content, list):
            content = "".join(part["text"] for part in content)
        out: dict[str, Any] = {"role": self.role, "content": content or ""}
        for key in ("name", "tool_call_id"):
            if getattr(self, key) is not None:
                out[key] = getattr(self, key)
        if self.tool_calls is not None:
            out["tool_calls"] = [_template_call(c) for c in self.tool_calls]
        return out


def _template_call(call: dict[str, Any]) -> dict[str, Any]:
    """An assistant message's tool call as chat templates read it: OpenAI sends ``function.arguments`` as a
    JSON string, templates render an object (``arguments | tojson``), so a string holding a JSON object is
    parsed (as vLLM does before rendering)."""
    function = call.get("function")
    if not isinstance(function, dict) or not isinstance(function.get("arguments"), str):
        return call
    try:
        arguments = json.loads(function["arguments"])
    except json.JSONDecodeError:
        return call
    if not isinstance(arguments, dict):
        return call
    return {**call, "function": {**function, "arguments": arguments}}


class _Conversation(_Sampling):
    """The fields the chat and Responses requests share: function ``tools`` and the choice among them, the
    alternatives listed per token, and the fields that are neutral here (their refused values are checked
    before parsing) or only recorded."""

    tools: list[dict[str, Any]] | None = None  # chat's form: {"type": "function", "function": {...}} (check_tools)
    # "required" or a named function: the call is forced by constrained decoding (constraints.py)
    tool_choice: Literal["auto", "none", "required"] | dict[str, Any] | None = None
    top_logprobs: int | None = Field(None, ge=0, le=MAX_TOP_LOGPROBS)
    parallel_tool_calls: bool | None = None
    service_tier: str | None = None
    safety_identifier: str | None = None
    prompt_cache_key: str | None = None
    prompt_cache_retention: str | None = None


class ChatRequest(_Conversation):
    messages: list[ChatMessage] = Field(min_length=1)

    @field_validator("tools")
    @classmethod
    def _tools(cls, value: list[dict[str, Any]] | None) -> list[dict[str, Any]] | None:
        for k, tool in enumerate(value or []):
            if tool.get("type") != "function" or not isinstance(tool.get("function"), dict):
                raise ValueError(f"{k}: a tool is {{\"type\": \"function\", \"function\": {{\"name\", "
                                 "\"description\", \"parameters\"}}}}")
            check_function(tool["function"], f"{k}.function")
        return value
    max_completion_tokens: int | None = Field(None, ge=1)
    logprobs: bool = False
    response_format: dict[str, Any] | None = None  # json_object, json_schema: constrained decoding (constraints.py)
    # accepted as neutral (REFUSED checks their values before parsing), or recorded only
    modalities: list[str] | None = None

    @property
    def output_limit(self) -> int | None:
        return self.max_completion_tokens or self.max_tokens

    @property
    def output_param(self) -> str:
        return "max_completion_tokens" if self.max_completion_tokens else "max_tokens"

    @property
    def top_logprobs_k(self) -> int:
        """How many alternatives each token's log-prob entry lists (0 unless asked)."""
        return (self.top_logprobs or 0) if self.logprobs else 0


class CompletionRequest(_Sampling):
    prompt: str | list[str] | list[int] | list[list[int]]
    logprobs: int | None = Field(None, ge=0, le=MAX_TOP_LOGPROBS)
    prompt_logprobs: int | None = Field(None, ge=0, le=0)  # vLLM's: 0, each prompt token's own log-prob

    @property
    def output_param(self) -> str:
        return "max_tokens"

    @property
    def top_logprobs_k(self) -> int:
        return self.logprobs or 0


class ResponsesRequest(_Conversation):
    """``POST /v1/responses``: ``input`` (a string, or a list of message, ``function_call`` and
    ``function_call_output`` items), ``instructions`` (a system message), function ``tools``,
    ``previous_response_id``; the sampling fields are the chat ones, ``max_output_tokens`` the output limit."""

    input: str | list[dict[str, Any]] | None = None
    instructions: str | None = None
    previous_response_id: str | None = None
    max_output_tokens: int | None = Field(None, ge=1)
    include: list[str] | None = None
    # accepted as neutral (RESPONSES_REFUSED checks their values before parsing), or recorded only
    text: dict[str, Any] | None = None
    reasoning: dict[str, Any] | None = None
    truncation: Literal["disabled"] | None = None
    background: bool | None = None
    max_tool_calls: int | None = None

    @field_validator("tools")
    @classmethod
    def _tools(cls, value: list[dict[str, Any]] | None) -> list[dict[str, Any]] | None:
        for k, tool in enumerate(value or []):
            if tool.get("type") != "function":
                raise ValueError(f"{k}: only function tools are supported (type {tool.get('type')!r})")
            check_function(tool, str(k))
        return value

    @property
    def output_limit(self) -> int | None:
        return self.max_output_tokens or self.max_tokens

    @property
    def output_param(self) -> str:
        return "max_output_tokens" if self.max_output_tokens else "max_tokens"

    @property
    def prompt_param(self) -> str:
        return "input"

    @property
    def logprobs(self) -> bool:
        return "message.output_text.logprobs" in (self.include or []) or bool(self.top_logprobs)

    @property
    def top_logprobs_k(self) -> int:
        return self.top_logprobs or 0

    def options(self) -> dict[str, Any]:
        given = super().options()
        for key in ("input", "previous_response_id"):  # stored as the messages they give
            given.pop(key, None)
        return given


def check_function(function: dict[str, Any], where: str) -> None:
    """A function tool as OpenAI takes it: a ``name`` of 1-64 letters, digits, ``_`` or ``-``, a string
    ``description`` when given, and ``parameters`` (when given) a valid JSON schema (checked against its
    metaschema) of an object, the call's arguments."""
    name = function.get("name")
    if not isinstance(name, str) or not FUNCTION_NAME.fullmatch(name):
        raise ValueError(f"{where}.name: a function name is 1-64 letters, digits, _ or -, got {name!r}")
    if function.get("description") is not None and not isinstance(function["description"], str):
        raise ValueError(f"{where}.description: a string")
    check_schema(function.get("parameters"), f"{where}.parameters", arguments=True)


def check_schema(schema: Any, where: str, *, arguments: bool = False) -> None:
    """``schema`` (None passes) as a JSON schema its metaschema accepts (``jsonschema``); ``arguments``: it
    describes a function's arguments, a JSON object."""
    if schema is None:
        return
    if not isinstance(schema, dict):
        raise ValueError(f"{where}: a JSON schema is an object, got {type(schema).__name__}")
    try:
        jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator).check_schema(schema)
    except jsonschema.SchemaError as err:
        at = "".join(f".{p}" for p in err.absolute_path)
        raise ValueError(f"{where}{at}: not a valid JSON schema: {err.message}") from None
    if arguments and schema.get("type", "object") != "object":
        raise ValueError(f"{where}: a function's arguments are an object (type \"object\"), got type "
                         f"{schema['type']!r}")


def _no_setting(value: Any) -> bool:
    return isinstance(value, dict) and all(v is None for v in value.values())


# The Responses fields the server does not apply: refused unless null or neutral (as REFUSED).
RESPONSES_REFUSED: dict[str, tuple[Callable[[Any], bool], str]] = {
    "text": (lambda v: isinstance(v, dict) and v.get("verbosity") in (None, "medium"),
             "text.verbosity is not supported"),
    "reasoning": (_no_setting, "reasoning is not supported: the served model has no reasoning setting"),
    "background": (_neutral(False), "background responses are not supported"),
    "max_tool_calls": (_neutral(), "max_tool_calls is not supported"),
    "conversation": (_neutral(), "conversations are not supported: send previous_response_id or the whole input"),
    "prompt": (_neutral(), "stored prompts are not supported"),
    "context_management": (_neutral(), "context_management is not supported"),
    "include": (lambda v: isinstance(v, list) and all(x == "message.output_text.logprobs" for x in v),
                "include: only message.output_text.logprobs is supported"),
}


def refuse_unsupported_responses(body: dict[str, Any]) -> None:
    for name, (neutral, why) in RESPONSES_REFUSED.items():
        if body.get(name) is not None and not neutral(body[name]):
            raise bad_request(why, name, code="unsupported_parameter")


class RewardRequest(_Body):
    """An episode's outcome: a finite ``reward``; ``metrics`` among ``f1``, ``em`` and ``sub_em``, each in [0, 1]
    (the F1 stored is ``metrics.f1``, else the reward when it lies in [0, 1])."""

    reward: FiniteFloat
    metrics: dict[str, FiniteFloat] = Field(default_factory=dict)
    prediction: str | None = None
    replace: bool = False  # a second reward replaces the first only when asked (else 409)

    @field_validator("metrics")
    @classmethod
    def _metrics(cls, value: dict[str, float]) -> dict[str, float]:
        for name, score in value.items():
            if name not in UNIT_METRICS:
                raise ValueError(f"{name}: unknown metric, the store keeps {', '.join(UNIT_METRICS)}")
            if not 0.0 <= score <= 1.0:
                raise ValueError(f"{name}: must lie in [0, 1], got {score}")
        return value


class PrivilegedRequest(_Body):
    """Privileged context for an episode's ``privileged`` teacher: the gold answers and evidence text."""

    text: str = ""
    answers: list[str] = Field(default_factory=list)
    task: str | None = Field(None, max_length=LIMITS["episodes.task_id"])
