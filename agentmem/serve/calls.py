"""What every OpenAI route of ``agentmem serve`` shares: reading and checking a request, generating it, and
storing it before it is answered (``Calls``, one per app, at ``app.state.calls``).

A route parses its body (``read_json``, ``parse``: 400s name the field), renders its prompts, then:

- ``prepare``: the checks every generation request passes (the model, ``n``, what the backend can do, the
  context length, the parent call, an episode already rewarded) and the ids its calls will be stored
  under (``Recorder.plan``);
- ``respond``: the response, non-streaming (generated, stored, then sent) or SSE (``stream``: tokens sent
  as the sampler produces them, stored, then the last chunk and ``[DONE]``).
"""

from __future__ import annotations

import asyncio
import json
import re
import time
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from fastapi import Request
from fastapi.responses import JSONResponse, StreamingResponse
from pydantic import BaseModel, ValidationError

from agentmem.serve.behind_gateway import NO, RECORD_HEADER
from agentmem.serve.bounds import (
    EPISODE,
    INVOCATION_ID,
    KIND,
    TASK,
    check_id,
    check_json,
    too_large,
)
from agentmem.serve.constraints import Constraint
from agentmem.serve.formatting import Formatter, LiveText, usage
from agentmem.serve.protocol import ApiError, bad_request, refuse_unsupported, server_error
from agentmem.serve.recorder import CallContext, Planned, Recorder, Sent
from agentmem.serve.sampler import Choice, Job, Sampler, Tokens
from agentmem.serve.tool_calls import ToolCallParser
from store.errors import ValueOutOfBounds

TRUE = ("1", "true", "yes")
SUBFIELD = re.compile(r"([\w-]+(?:\.[\w-]+)*): ")  # a validator's message that begins with the part it is about


@dataclass(frozen=True)
class ServeSettings:
    """What the app needs besides the sampler and recorder: the served model name, the context length,
    limits, the API key (None: no authentication), and what the backend can do."""

    model_name: str
    context_length: int
    max_n: int
    default_max_tokens: int
    api_key: str | None = None
    top_logprobs: bool = True  # whether the sampler can list alternatives
    nucleus: bool = True  # whether top_p < 1 keeps the stored log-probs full-vocabulary (not on vLLM)
    shaping: bool = True  # whether the backend applies logit_bias, penalties, top_k and min_p
    constrains: bool = True  # whether the backend applies a grammar (response_format json, forced tool calls)
    max_body_bytes: int = field(kw_only=True)  # a longer request body is refused (413) before it is parsed


@dataclass(frozen=True)
class Prepared:
    """A checked request: its prompts' ids, what the client sent, the generation job, the client's context
    and the ids its calls will be stored under."""

    prompts: list[list[int]]
    sent: Sent
    job: Job
    ctx: CallContext
    planned: Planned


class Calls:
    def __init__(self, sampler: Sampler, recorder: Recorder, tokenizer, settings: ServeSettings):
        self.sampler, self.recorder, self.tokenizer, self.settings = sampler, recorder, tokenizer, settings

    def check_request(self, req) -> None:
        """The checks that need no rendering: the model served and ``n``."""
        settings = self.settings
        if req.model != settings.model_name:
            raise ApiError(404, f"The model `{req.model}` does not exist: this server serves "
                                f"`{settings.model_name}`", type="invalid_request_error", param="model",
                           code="model_not_found")
        if req.n > settings.max_n:
            raise bad_request(f"n is {req.n}, the server allows at most {settings.max_n} (--max-n)", "n")

    async def prepare(self, request: Request, req, episode: str | None, prompts: list[list[int]], sent: Sent,
                      kind: str, *, follows: tuple[str | None, str] | None = None,
                      constraint: Constraint | None = None) -> Prepared:
        """``follows``: (episode, invocation id) of the call this one continues (``previous_response_id``):
        its episode and parent unless the client names others. ``constraint``: the grammar every output follows
        (``constraints.py``)."""
        settings = self.settings
        self.check_request(req)
        top_k = req.top_logprobs_k
        if top_k and not settings.top_logprobs:
            raise bad_request("this backend cannot list top log-probs", "top_logprobs")
        if req.top_p is not None and req.top_p < 1 and not settings.nucleus:
            raise bad_request("top_p < 1 is not supported on this backend: its log-probs would be renormalised over "
                              "the nucleus, not the full-vocabulary ones agentmem stores", "top_p")
        if any(len(p) == 0 for p in prompts):
            raise bad_request("empty prompt", "prompt")
        longest = max(len(p) for p in prompts)
        room = settings.context_length - longest
        limit = req.output_limit
        if room < 1:
            raise bad_request(f"This model's maximum context length is {settings.context_length} tokens. However, "
                              f"you requested {longest} prompt tokens.", getattr(req, "prompt_param", None)
                              or ("messages" if sent.messages is not None else "prompt"), code="context_length_exceeded")
        if limit is not None and limit > room:
            raise bad_request(f"This model's maximum context length is {settings.context_length} tokens. However, "
                              f"you requested {longest} prompt tokens plus {limit} output tokens.", req.output_param,
                              code="context_length_exceeded")
        params = req.params(limit if limit is not None else min(settings.default_max_tokens, room))
        if constraint is not None:
            if not settings.constrains:
                raise bad_request(f"{constraint.param}: this backend cannot constrain decoding", constraint.param,
                                  code="unsupported_parameter")
            params = replace(params, grammar=constraint.grammar)
        if params.shaping and not settings.shaping:
            name = next(iter(params.shaping))
            raise bad_request(f"{name} is not supported on this backend", name, code="unsupported_parameter")
        vocab = len(self.tokenizer)
        for tid, _ in params.logit_bias:
            if tid >= vocab:
                raise bad_request(f"logit_bias: token id {tid} is outside the vocabulary [0, {vocab})", "logit_bias")
        ctx = context(request, req.metadata or {}, episode, kind)
        if follows is not None:
            ctx = replace(ctx, episode=ctx.episode or follows[0], parent=ctx.parent or follows[1])
        planned = self.recorder.plan(ctx, len(prompts), req.n)
        # a group's episodes ({episode}.{i}) and a prompt list's tasks grow a suffix: each must fit too (an episode
        # is named by the routes that reward and read it)
        for name, task in zip(planned.client_episodes, planned.tasks, strict=True):
            check_id(name, EPISODE, ctx.episode_field or "episode")
            check_id(task, TASK, ctx.task_field or ctx.episode_field or "episode")
        if ctx.record:
            await asyncio.to_thread(self.recorder.check_call, ctx, planned)
        job = Job(prompts, req.n, params, tuple(req.stops), top_k, getattr(req, "prompt_logprobs", None) is not None,
                  ctx.episode, sent.messages, sent.tools, sent.sampling.get("tool_choice"))
        return Prepared(prompts, sent, job, ctx, planned)

    async def respond(self, request: Request, req, prep: Prepared, *, chat: bool, logprobs: bool,
                      tool_calls: ToolCallParser | None = None) -> Any:
        headers = {"X-Agentmem-Invocation": ",".join(prep.planned.invocation_ids),
                   "X-Agentmem-Episode": ",".join(prep.planned.episode_ids)}
        shape = Formatter(self.tokenizer, self.settings.model_name, self.recorder.policy_version, chat, logprobs,
                          tool_calls, req.return_token_ids, prep.job.prompt_logprobs)
        if req.stream:
            return StreamingResponse(self.stream(request, prep, shape, req.include_usage), headers=headers,
                                     media_type="text/event-stream")
        choices = await asyncio.wrap_future(self.sampler.submit(prep.job))
        await asyncio.to_thread(self.store, prep, choices)
        out = shape.response(prep.planned.invocation_ids[0], int(time.time()), prep.prompts, choices,
                             req.return_token_ids)
        return JSONResponse(out, headers=headers)

    def store(self, prep: Prepared, choices: list[Choice]) -> None:
        if prep.ctx.record:  # not when a gateway in front records the call (X-Agentmem-Record: no)
            self.recorder.record(prep.ctx, prep.planned, choices, prep.sent, prep.job.params.temperature, prep.job.n)

    async def stream(self, request: Request, prep: Prepared, shape: Formatter, include_usage: bool) -> AsyncIterator[str]:
        call_id, created = prep.planned.invocation_ids[0], int(time.time())
        # tokens go out as the sampler produces them (the text that may begin a stop string or a tool call held
        # back), unless tool calls are parsed by a template whose calls may begin anywhere
        opener = shape.tool_calls.opener if shape.tool_calls is not None else None
        live: dict[int, LiveText] | None = None if shape.tool_calls is not None and opener is None else {}
        rows = prep.job.rows
        try:
            async for event in self.sampler.stream(prep.job):
                if isinstance(event, Tokens):
                    if live is None:
                        continue
                    if event.index not in live:
                        live[event.index] = LiveText(self.tokenizer, rows[event.index], prep.job.stops, opener)
                        for piece in shape.role_chunk(call_id, created, event.index):
                            yield piece
                    so_far, start, stop, delta = live[event.index].add(event)
                    yield shape.piece(call_id, created, event.index, so_far, start, stop, delta)
                else:
                    choices = event
        except Exception as exc:  # noqa: BLE001  the stream has started: the error goes in it, nothing is stored
            yield f"data: {json.dumps(stream_error(exc).body())}\n\n"
            return
        for piece in shape.token_chunks(call_id, created, choices, live):
            yield piece
            await asyncio.sleep(0)
        if await request.is_disconnected():
            return  # the client is gone: its call is not stored
        try:
            await asyncio.to_thread(self.store, prep, choices)
        except Exception as exc:  # noqa: BLE001  e.g. the episode was rewarded meanwhile: the error goes in the stream
            yield f"data: {json.dumps(stream_error(exc).body())}\n\n"
            return
        for piece in shape.final_chunks(call_id, created, choices, usage(prep.prompts, choices) if include_usage else None):
            yield piece


def stream_error(exc: BaseException) -> ApiError:
    """The error a started stream ends with: a refusal as it is (a store bound: a 400 naming the field), anything
    else as a 500 without its details (``server_error``)."""
    if isinstance(exc, ApiError):
        return exc
    if isinstance(exc, ValueOutOfBounds):
        return bad_request(str(exc), exc.field)
    return server_error(exc)


def context(request: Request, meta: dict, episode: str | None, kind: str) -> CallContext:
    """What the client said about a call: its episode (the URL path's, else the header's, else the body's
    metadata), task, kind, parent, and whether it may reopen a rewarded episode. Each is checked against the
    store's column it lands in (``bounds``), naming the header or metadata key that gave it."""
    h = request.headers

    def pick(header: str, *keys: str) -> tuple[str | None, str | None]:
        """The value and the field that gave it (the header, else the first metadata key)."""
        if h.get(header):
            return h[header], header_name(header)
        for key in keys:
            if meta.get(key):
                return str(meta[key]), f"metadata.{key}"
        return None, None

    if episode is not None:
        named, episode_field = episode, "episode"
    else:
        named, episode_field = pick("x-agentmem-episode", "agentmem_episode", "episode")
    task, task_field = pick("x-agentmem-task", "agentmem_task", "task")
    given_kind, kind_field = pick("x-agentmem-kind", "agentmem_kind", "kind")
    reopen, _ = pick("x-agentmem-reopen", "agentmem_reopen")
    record = h.get(RECORD_HEADER)
    check_id(named, EPISODE, episode_field or "episode")
    check_id(task, TASK, task_field or "task")
    check_id(given_kind, KIND, kind_field or "kind")
    check_id(h.get("x-agentmem-parent"), INVOCATION_ID, "X-Agentmem-Parent")
    return CallContext(episode=named, task=task, kind=given_kind or kind, parent=h.get("x-agentmem-parent"),
                       reopen=reopen is not None and reopen.lower() in TRUE,
                       record=record is None or record.lower() not in NO, episode_field=episode_field,
                       task_field=task_field)


def header_name(header: str) -> str:
    """``x-agentmem-task`` as the docs write it: ``X-Agentmem-Task``."""
    return "-".join(part.capitalize() for part in header.split("-"))


async def read_body(request: Request) -> bytes:
    """The request's body, refused (413) once it is over the server's limit: by its ``Content-Length`` before
    anything is read, else as soon as the bytes read pass it."""
    limit = request.app.state.calls.settings.max_body_bytes
    length = request.headers.get("content-length", "")
    if length.isdigit() and int(length) > limit:
        raise too_large(limit)
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise too_large(limit)
        chunks.append(chunk)
    return b"".join(chunks)


def decode_json(raw: bytes) -> dict:
    """A body as a JSON object whose every value the store takes alike (``bounds.check_json``)."""
    try:
        body = json.loads(raw or b"null")
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise bad_request(f"the request body is not valid JSON: {exc}", "body") from None
    except RecursionError:
        raise bad_request("the request body is nested too deeply", "body") from None
    if not isinstance(body, dict):
        raise bad_request("the request body must be a JSON object", "body")
    check_json(body)
    return body


async def read_json(request: Request) -> dict:
    """The request's body as a checked JSON object; decoded and checked off the event loop, so that a large
    body does not hold up the other requests (``/health`` among them)."""
    return await asyncio.to_thread(decode_json, await read_body(request))


async def read_request(request: Request, model: type[BaseModel], *, openai: bool = True,
                       refuse: Callable[[dict], None] | None = None) -> Any:
    """The request's body read (``read_json``) and validated as ``model`` (``parse``; ``refuse``: the checks
    of the fields refused before it), off the event loop."""
    raw = await read_body(request)

    def read() -> Any:
        body = decode_json(raw)
        if refuse is not None:
            refuse(body)
        return parse(model, body, openai=openai)

    return await asyncio.to_thread(read)


def parse(model: type[BaseModel], body: dict, *, openai: bool = True) -> Any:
    """``body`` as ``model``; an OpenAI request's fields the server does not apply are refused first."""
    if openai:
        refuse_unsupported(body)
    try:
        return model.model_validate(body)
    except ValidationError as exc:
        raise validation_error(exc.errors()) from None


def validation_error(errors: Sequence[Any]) -> ApiError:
    """The 400 of the first validation error; ``param`` the field's path, down to the part a validator names at
    the head of its message (``tools.0.function.parameters``)."""
    first = errors[0] if errors else {"loc": (), "msg": "invalid request"}
    param = ".".join(str(x) for x in first.get("loc", ()) if x != "body") or None
    if first.get("type") == "extra_forbidden":
        return bad_request(f"unknown field {param!r}: this server does not apply it", param,
                           code="unsupported_parameter")
    msg = str(first.get("msg"))
    if first.get("type") == "value_error":
        msg = msg.removeprefix("Value error, ")
        where = SUBFIELD.match(msg)
        if where:
            param = f"{param}.{where.group(1)}" if param else where.group(1)
            msg = msg[where.end():]
    return bad_request(f"{param}: {msg}" if param else msg, param or "body")
