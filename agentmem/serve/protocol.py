"""The OpenAI request bodies the server accepts, and the error bodies it answers with.

Bodies follow the OpenAI API: unknown fields are ignored (clients send many), known fields are checked.
An ``ApiError`` carries the HTTP status and the ``{"error": {"message", "type", "param", "code"}}`` body
an OpenAI client expects (the ``openai`` package raises ``BadRequestError`` for 400,
``AuthenticationError`` for 401, ``NotFoundError`` for 404).
"""

from __future__ import annotations

import json
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from agentmem.errors import AgentmemError

MAX_TOP_LOGPROBS = 20


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


class _Body(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)


class _Sampling(_Body):
    """The sampling fields both endpoints share (OpenAI defaults: temperature 1, top_p 1, n 1)."""

    model: str
    n: int = Field(1, ge=1)
    temperature: float | None = Field(None, ge=0, le=2)
    top_p: float | None = Field(None, gt=0, le=1)
    max_tokens: int | None = Field(None, ge=1)
    stop: str | list[str] | None = None
    seed: int | None = None
    stream: bool = False
    metadata: dict[str, Any] | None = None
    # not implemented by the sampler: refused unless neutral, so that no client believes they were applied
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    logit_bias: dict[str, float] | None = None

    @field_validator("presence_penalty", "frequency_penalty")
    @classmethod
    def _no_penalty(cls, value: float | None) -> float | None:
        if value:
            raise ValueError("penalties are not supported: the stored log-probs are the plain tempered model's")
        return value

    @field_validator("logit_bias")
    @classmethod
    def _no_bias(cls, value: dict[str, float] | None) -> dict[str, float] | None:
        if value:
            raise ValueError("logit_bias is not supported: the stored log-probs are the plain tempered model's")
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

    def sampling(self, **extra: Any) -> dict[str, Any]:
        """The sampling fields as the client gave them (omitted: the default), as ``serve_calls`` stores them."""
        fields = {"temperature": self.temperature, "top_p": self.top_p, "max_tokens": self.output_limit,
                  "seed": self.seed, "stop": self.stops or None, "n": self.n, **extra}
        return {k: v for k, v in fields.items() if v is not None}


class ChatMessage(_Body):
    role: str
    content: str | list[dict[str, Any]] | None = None
    name: str | None = None
    tool_calls: list[dict[str, Any]] | None = None
    tool_call_id: str | None = None

    def as_template(self) -> dict[str, Any]:
        """The message as a chat template reads it: text parts joined into one string."""
        content = self.content
        if isinstance(content, list):
            if any(part.get("type") != "text" for part in content):
                raise bad_request("only text content parts are supported", "messages")
            content = "".join(str(part.get("text", "")) for part in content)
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


class ChatRequest(_Sampling):
    messages: list[ChatMessage] = Field(min_length=1)
    tools: list[dict[str, Any]] | None = None
    tool_choice: Literal["auto", "none"] | None = None  # "required" or a named function would need constrained decoding
    max_completion_tokens: int | None = Field(None, ge=1)
    logprobs: bool = False
    top_logprobs: int | None = Field(None, ge=0, le=MAX_TOP_LOGPROBS)

    @property
    def output_limit(self) -> int | None:
        return self.max_completion_tokens or self.max_tokens

    @property
    def top_k(self) -> int:
        """How many alternatives each token's log-prob entry lists (0 unless asked)."""
        return self.top_logprobs or 0


class CompletionRequest(_Sampling):
    prompt: str | list[str] | list[int] | list[list[int]]
    logprobs: int | None = Field(None, ge=0, le=MAX_TOP_LOGPROBS)
    echo: Literal[False] = False

    @property
    def output_limit(self) -> int | None:
        return self.max_tokens

    @property
    def top_k(self) -> int:
        return self.logprobs or 0


class RewardRequest(_Body):
    reward: float
    metrics: dict[str, float] = Field(default_factory=dict)
    prediction: str | None = None


class PrivilegedRequest(_Body):
    """Privileged context for an episode's ``privileged`` teacher: the gold answers and evidence text."""

    text: str = ""
    answers: list[str] = Field(default_factory=list)
    task: str | None = None
