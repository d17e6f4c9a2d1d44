"""The FastAPI app of ``agentmem serve``: OpenAI routes that record every call before answering it.

Routes (each ``/v1/...`` route also answers under ``/episodes/{episode}/v1/...``, the episode then being
the path's, so an agent changes only its ``base_url``):
- ``POST /v1/chat/completions``: messages (and tools) rendered by the model's chat template
  (``apply_chat_template(..., add_generation_prompt=True)``, tokenised without added special tokens, as
  the agent loop renders its prompts); non-streaming or SSE; ``n``, ``temperature``, ``top_p``,
  ``max_tokens``/``max_completion_tokens``, ``stop``, ``seed``, ``logprobs``/``top_logprobs``; with
  ``tools``, tool calls in the reply come back as ``tool_calls`` (``tool_calls.py``);
- ``POST /v1/completions``: a text prompt (tokenised with the tokenizer's special tokens, as vLLM does) or
  token ids, used exactly; a list of prompts;
- ``GET /v1/models``;
- ``POST /agentmem/episodes/{episode}/reward`` and ``.../privileged``.

Episodes: the URL path, else the ``X-Agentmem-Episode`` header, else ``metadata.agentmem_episode`` (or
``metadata.episode``) in the body; task and kind likewise (``X-Agentmem-Task``/``X-Agentmem-Kind``,
``metadata.task``/``metadata.kind``); ``X-Agentmem-Parent`` names the call this one continues. Every
response names its invocation: the ``id`` field and ``X-Agentmem-Invocation`` (comma-separated per choice
for ``n > 1``), and ``X-Agentmem-Episode`` the episode row id(s). ``"return_token_ids": true`` in the body
(vLLM's flag) adds ``prompt_token_ids`` and each choice's ``token_ids`` to a non-streaming response.

Storing: a non-streaming call is stored before its response is sent. A streaming call sends its tokens,
is stored, then sends its last chunk (with the finish reason) and ``[DONE]``; a client gone before that has
nothing stored. Errors answer with the OpenAI status and ``{"error": {...}}`` body.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, StreamingResponse
from pydantic import ValidationError

from agentmem.policy.types import SamplingParams
from agentmem.serve.protocol import (
    ApiError,
    ChatRequest,
    CompletionRequest,
    PrivilegedRequest,
    RewardRequest,
    bad_request,
)
from agentmem.serve.recorder import CallContext, Planned, Recorder, Sent
from agentmem.serve.responses import Formatter, LiveText, usage
from agentmem.serve.sampler import Choice, Job, Tokens
from agentmem.serve.tool_calls import ToolCallParser


@dataclass(frozen=True)
class ServeSettings:
    """What the app needs besides the sampler and recorder: the served model name, the context length,
    limits, and the bearer token (None: no authentication)."""

    model_name: str
    context_length: int
    max_n: int = 16
    default_max_tokens: int = 256
    api_key: str | None = None
    top_logprobs: bool = True  # whether the sampler can list alternatives (a backend with a model)
    nucleus: bool = True  # whether top_p < 1 keeps the stored log-probs full-vocabulary (not on vLLM)


@dataclass(frozen=True)
class _Prepared:
    prompts: list[list[int]]
    sent: Sent
    job: Job
    ctx: CallContext
    planned: Planned


def create_app(sampler, recorder: Recorder, tokenizer, settings: ServeSettings) -> FastAPI:
    app = FastAPI(title="agentmem serve", docs_url=None, redoc_url=None, openapi_url=None)

    @app.exception_handler(ApiError)
    async def _api_error(_request: Request, exc: ApiError) -> JSONResponse:
        return JSONResponse(exc.body(), status_code=exc.status)

    @app.exception_handler(Exception)
    async def _server_error(_request: Request, exc: Exception) -> JSONResponse:
        # a failed generation or store write: the OpenAI body, and nothing stored (one transaction per call)
        err = ApiError(500, f"the server failed on this call: {type(exc).__name__}: {exc}", type="server_error")
        return JSONResponse(err.body(), status_code=500)

    @app.exception_handler(RequestValidationError)
    async def _invalid(_request: Request, exc: RequestValidationError) -> JSONResponse:
        return JSONResponse(_validation_error(exc.errors()).body(), status_code=400)

    @app.middleware("http")
    async def _auth(request: Request, call_next):
        if settings.api_key is not None and request.url.path not in ("/health",):
            if request.headers.get("authorization", "") != f"Bearer {settings.api_key}":
                err = ApiError(401, "invalid or missing API key: send Authorization: Bearer KEY",
                               type="invalid_request_error", code="invalid_api_key")
                return JSONResponse(err.body(), status_code=401)
        return await call_next(request)

    def models_body() -> dict[str, Any]:
        return {"object": "list", "data": [{"id": settings.model_name, "object": "model", "created": 0,
                                            "owned_by": "agentmem"}]}

    @app.get("/health")
    async def health() -> dict[str, str]:
        return {"status": "ok", "run": recorder.run_id}

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        return models_body()

    @app.get("/episodes/{episode}/v1/models")
    async def episode_models(episode: str) -> dict[str, Any]:
        return models_body()

    async def chat(request: Request, episode: str | None) -> Any:
        body = await _json(request)
        req = _parse(ChatRequest, body)
        if req.top_logprobs and not req.logprobs:
            raise bad_request("top_logprobs needs logprobs: true", "top_logprobs")
        messages = [m.as_template() for m in req.messages]
        try:
            text = tokenizer.apply_chat_template(messages, tools=req.tools, add_generation_prompt=True,
                                                 tokenize=False)
        except Exception as exc:  # noqa: BLE001  a template refusing these messages is the client's error
            raise bad_request(f"the model's chat template cannot render these messages: {exc}", "messages") from None
        ids = list(tokenizer(text, add_special_tokens=False)["input_ids"])
        question = next((m["content"] for m in reversed(messages) if m["role"] == "user"), messages[-1]["content"])
        sent = Sent([text], [question], messages, req.tools, req.sampling(top_logprobs=req.top_logprobs,
                                                                     logprobs=req.logprobs))
        prep = await _prepare(request, req, body, episode, [ids], sent, "chat", req.top_k if req.logprobs else 0)
        parser = ToolCallParser.for_request(tokenizer, req.tools, req.tool_choice, text)
        return await _respond(request, req, prep, chat=True, logprobs=req.logprobs, body=body, tool_calls=parser)

    async def completions(request: Request, episode: str | None) -> Any:
        body = await _json(request)
        req = _parse(CompletionRequest, body)
        prompts = _completion_prompts(req.prompt)
        vocab = len(tokenizer)
        if any(not 0 <= t < vocab for p in prompts if not isinstance(p, str) for t in p):
            raise bad_request(f"prompt token ids must be in [0, {vocab})", "prompt")
        ids = [list(tokenizer(p, add_special_tokens=True)["input_ids"]) if isinstance(p, str) else p for p in prompts]
        texts = [p if isinstance(p, str) else tokenizer.decode(p) for p in prompts]
        sent = Sent(texts, texts, None, None, req.sampling(logprobs=req.logprobs))
        prep = await _prepare(request, req, body, episode, ids, sent, "completion", req.top_k)
        return await _respond(request, req, prep, chat=False, logprobs=req.logprobs is not None, body=body)

    @app.post("/v1/chat/completions")
    async def chat_route(request: Request) -> Any:
        return await chat(request, None)

    @app.post("/episodes/{episode}/v1/chat/completions")
    async def episode_chat_route(request: Request, episode: str) -> Any:
        return await chat(request, episode)

    @app.post("/v1/completions")
    async def completions_route(request: Request) -> Any:
        return await completions(request, None)

    @app.post("/episodes/{episode}/v1/completions")
    async def episode_completions_route(request: Request, episode: str) -> Any:
        return await completions(request, episode)

    @app.post("/agentmem/episodes/{episode}/reward")
    async def reward(request: Request, episode: str) -> dict[str, Any]:
        req = _parse(RewardRequest, await _json(request))
        ep = await asyncio.to_thread(recorder.reward, episode, req.reward, req.metrics, req.prediction)
        return {"episode_id": ep.id, "reward": ep.reward, "f1": ep.f1, "status": ep.status.value}

    @app.post("/agentmem/episodes/{episode}/privileged")
    async def privileged(request: Request, episode: str) -> dict[str, Any]:
        req = _parse(PrivilegedRequest, await _json(request))
        ep = await asyncio.to_thread(recorder.privileged, episode, req.text, req.answers, req.task)
        return {"episode_id": ep.id, "answers": ep.gold_answers, "evidence": ep.evidence}

    async def _prepare(request: Request, req, body: dict, episode: str | None, prompts: list[list[int]],
                       sent: Sent, kind: str, top_k: int) -> _Prepared:
        if req.model != settings.model_name:
            raise ApiError(404, f"The model `{req.model}` does not exist: this server serves "
                                f"`{settings.model_name}`", type="invalid_request_error", param="model",
                           code="model_not_found")
        if req.n > settings.max_n:
            raise bad_request(f"n is {req.n}, the server allows at most {settings.max_n} (--max-n)", "n")
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
        if room < 1 or (limit is not None and limit > room):
            asked = f" plus {limit} output tokens" if limit is not None else ""
            raise bad_request(f"This model's maximum context length is {settings.context_length} tokens. However, "
                              f"you requested {longest} prompt tokens{asked}.", "messages",
                              code="context_length_exceeded")
        max_new = limit if limit is not None else min(settings.default_max_tokens, room)
        temperature = 1.0 if req.temperature is None else req.temperature
        params = SamplingParams(temperature=temperature, top_p=1.0 if req.top_p is None else req.top_p,
                                max_new_tokens=max_new, seed=req.seed)
        ctx = _context(request, body, episode, kind)
        await asyncio.to_thread(recorder.check_parent, ctx.parent)
        job = Job(prompts, req.n, params, tuple(req.stops), top_k)
        return _Prepared(prompts, sent, job, ctx, recorder.plan(ctx, len(prompts), req.n))

    async def _respond(request: Request, req, prep: _Prepared, *, chat: bool, logprobs: bool, body: dict,
                       tool_calls: ToolCallParser | None = None) -> Any:
        headers = {"X-Agentmem-Invocation": ",".join(prep.planned.invocation_ids),
                   "X-Agentmem-Episode": ",".join(prep.planned.episode_ids)}
        shape = Formatter(tokenizer, settings.model_name, recorder.policy_version, chat, logprobs, tool_calls)
        if req.stream:
            include_usage = bool((body.get("stream_options") or {}).get("include_usage"))
            return StreamingResponse(_stream(request, prep, shape, include_usage), headers=headers,
                                     media_type="text/event-stream")
        choices = await asyncio.wrap_future(sampler.submit(prep.job))
        await asyncio.to_thread(_store, prep, choices)
        out = shape.response(prep.planned.invocation_ids[0], int(time.time()), prep.prompts, choices,
                             bool(body.get("return_token_ids")))
        return JSONResponse(out, headers=headers)

    def _store(prep: _Prepared, choices: list[Choice]) -> None:
        recorder.record(prep.ctx, prep.planned, choices, prep.sent, prep.job.params.temperature, prep.job.n)

    async def _stream(request: Request, prep: _Prepared, shape: Formatter, include_usage: bool) -> AsyncIterator[str]:
        call_id, created = prep.planned.invocation_ids[0], int(time.time())
        # tokens go out as the sampler produces them, unless the whole reply must be seen first (a stop string
        # may cut it, tool calls are parsed from it)
        live: dict[int, LiveText] | None = None if prep.job.stops or shape.tool_calls else {}
        rows = prep.job.rows
        try:
            async for event in sampler.stream(prep.job):
                if isinstance(event, Tokens):
                    if live is None:
                        continue
                    if event.index not in live:
                        live[event.index] = LiveText(tokenizer, rows[event.index])
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
        await asyncio.to_thread(_store, prep, choices)
        for piece in shape.final_chunks(call_id, created, choices, usage(prep.prompts, choices) if include_usage else None):
            yield piece

    return app


def _completion_prompts(prompt: Any) -> list[str | list[int]]:
    if isinstance(prompt, str):
        return [prompt]
    if prompt and all(isinstance(x, int) for x in prompt):
        return [list(prompt)]
    if not prompt:
        raise bad_request("empty prompt", "prompt")
    return list(prompt)


def _context(request: Request, body: dict, episode: str | None, kind: str) -> CallContext:
    meta = body.get("metadata") or {}
    h = request.headers

    def pick(header: str, *keys: str) -> str | None:
        value = h.get(header)
        for key in keys:
            value = value or meta.get(key)
        return str(value) if value is not None else None

    return CallContext(episode=episode or pick("x-agentmem-episode", "agentmem_episode", "episode"),
                       task=pick("x-agentmem-task", "agentmem_task", "task"),
                       kind=pick("x-agentmem-kind", "agentmem_kind", "kind") or kind,
                       parent=h.get("x-agentmem-parent"))


async def _json(request: Request) -> dict:
    try:
        body = json.loads(await request.body() or b"null")
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise bad_request(f"the request body is not valid JSON: {exc}") from None
    if not isinstance(body, dict):
        raise bad_request("the request body must be a JSON object")
    return body


def _parse(model: type, body: dict):
    try:
        return model.model_validate(body)
    except ValidationError as exc:
        raise _validation_error(exc.errors()) from None


def _validation_error(errors: list[dict]) -> ApiError:
    first = errors[0] if errors else {"loc": (), "msg": "invalid request"}
    param = ".".join(str(x) for x in first.get("loc", ()) if x != "body") or None
    return bad_request(f"{param}: {first.get('msg')}" if param else str(first.get("msg")), param)
