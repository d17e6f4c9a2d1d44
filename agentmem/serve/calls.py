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
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, replace
from typing import Any

from fastapi import Request
from fastapi.responses import JSONResponse, StreamingResponse
from pydantic import BaseModel, ValidationError

from agentmem.serve.constraints import Constraint
from agentmem.serve.gateway import NO, RECORD_HEADER
from agentmem.serve.protocol import ApiError, bad_request, refuse_unsupported
from agentmem.serve.recorder import CallContext, Planned, Recorder, Sent
from agentmem.serve.responses import Formatter, LiveText, usage
from agentmem.serve.sampler import Choice, Job, Tokens
from agentmem.serve.tool_calls import ToolCallParser

TRUE = ("1", "true", "yes")


@dataclass(frozen=True)
class ServeSettings:
    """What the app needs besides the sampler and recorder: the served model name, the context length,
    limits, the API key (None: no authentication), and what the backend can do."""

    model_name: str
    context_length: int
    max_n: int = 16
    default_max_tokens: int = 256
    api_key: str | None = None
    top_logprobs: bool = True  # whether the sampler can list alternatives
    nucleus: bool = True  # whether top_p < 1 keeps the stored log-probs full-vocabulary (not on vLLM)
    shaping: bool = True  # whether the backend applies logit_bias, penalties, top_k and min_p
    constrains: bool = True  # whether the backend applies a grammar (response_format json, forced tool calls)


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
    def __init__(self, sampler, recorder: Recorder, tokenizer, settings: ServeSettings):
        self.sampler, self.recorder, self.tokenizer, self.settings = sampler, recorder, tokenizer, settings

    async def prepare(self, request: Request, req, episode: str | None, prompts: list[list[int]], sent: Sent,
                      kind: str, *, follows: tuple[str | None, str] | None = None,
                      constraint: Constraint | None = None) -> Prepared:
        """``follows``: (episode, invocation id) of the call this one continues (``previous_response_id``):
        its episode and parent unless the client names others. ``constraint``: the grammar every output follows
        (``constraints.py``)."""
        settings = self.settings
        if req.model != settings.model_name:
            raise ApiError(404, f"The model `{req.model}` does not exist: this server serves "
                                f"`{settings.model_name}`", type="invalid_request_error", param="model",
                           code="model_not_found")
        if req.n > settings.max_n:
            raise bad_request(f"n is {req.n}, the server allows at most {settings.max_n} (--max-n)", "n")
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
            err = exc if isinstance(exc, ApiError) else ApiError(500, f"{type(exc).__name__}: {exc}", type="server_error")
            yield f"data: {json.dumps(err.body())}\n\n"
            return
        for piece in shape.token_chunks(call_id, created, choices, live):
            yield piece
            await asyncio.sleep(0)
        if await request.is_disconnected():
            return  # the client is gone: its call is not stored
        try:
            await asyncio.to_thread(self.store, prep, choices)
        except ApiError as err:  # e.g. the episode was rewarded meanwhile: the error goes in the stream
            yield f"data: {json.dumps(err.body())}\n\n"
            return
        for piece in shape.final_chunks(call_id, created, choices, usage(prep.prompts, choices) if include_usage else None):
            yield piece


def context(request: Request, meta: dict, episode: str | None, kind: str) -> CallContext:
    """What the client said about a call: its episode (the URL path's, else the header's, else the body's
    metadata), task, kind, parent, and whether it may reopen a rewarded episode."""
    h = request.headers

    def pick(header: str, *keys: str) -> str | None:
        value = h.get(header)
        for key in keys:
            value = value or meta.get(key)
        return str(value) if value is not None else None

    reopen = pick("x-agentmem-reopen", "agentmem_reopen")
    record = h.get(RECORD_HEADER)
    return CallContext(episode=episode or pick("x-agentmem-episode", "agentmem_episode", "episode"),
                       task=pick("x-agentmem-task", "agentmem_task", "task"),
                       kind=pick("x-agentmem-kind", "agentmem_kind", "kind") or kind,
                       parent=h.get("x-agentmem-parent"),
                       reopen=reopen is not None and reopen.lower() in TRUE,
                       record=record is None or record.lower() not in NO)


async def read_json(request: Request) -> dict:
    try:
        body = json.loads(await request.body() or b"null")
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise bad_request(f"the request body is not valid JSON: {exc}") from None
    if not isinstance(body, dict):
        raise bad_request("the request body must be a JSON object")
    return body


def parse(model: type[BaseModel], body: dict, *, openai: bool = True) -> Any:
    """``body`` as ``model``; an OpenAI request's fields the server does not apply are refused first."""
    if openai:
        refuse_unsupported(body)
    try:
        return model.model_validate(body)
    except ValidationError as exc:
        raise validation_error(exc.errors()) from None


def validation_error(errors: Sequence[Any]) -> ApiError:
    first = errors[0] if errors else {"loc": (), "msg": "invalid request"}
    param = ".".join(str(x) for x in first.get("loc", ()) if x != "body") or None
    if first.get("type") == "extra_forbidden":
        return bad_request(f"unknown field {param!r}: this server does not apply it", param,
                           code="unsupported_parameter")
    return bad_request(f"{param}: {first.get('msg')}" if param else str(first.get("msg")), param)
