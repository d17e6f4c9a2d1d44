"""The FastAPI app of ``agentmem serve``: OpenAI routes that record every call before answering it.

Routes (each ``/v1/...`` route also answers under ``/episodes/{episode}/v1/...``, the episode then being
the path's, so an agent changes only its ``base_url``):
- ``POST /v1/chat/completions``: messages (and tools) rendered by the model's chat template
  (``apply_chat_template(..., add_generation_prompt=True)``, tokenised without added special tokens, as
  the agent loop renders its prompts); non-streaming or SSE; ``n``, ``temperature``, ``top_p``,
  ``max_tokens``/``max_completion_tokens``, ``stop``, ``seed``, ``logprobs``/``top_logprobs``;
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
from agentmem.serve.sampler import Choice, Job


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
        messages = [m.as_template() for m in req.messages]
        try:
            text = tokenizer.apply_chat_template(messages, tools=req.tools, add_generation_prompt=True,
                                                 tokenize=False)
        except Exception as exc:  # noqa: BLE001  a template refusing these messages is the client's error
            raise bad_request(f"the model's chat template cannot render these messages: {exc}", "messages") from None
        ids = list(tokenizer(text, add_special_tokens=False)["input_ids"])
        question = next((m["content"] for m in reversed(messages) if m["role"] == "user"), messages[-1]["content"])
        sent = Sent([text], [question], messages, req.tools, _sampling(req, top_logprobs=req.top_logprobs,
                                                                       logprobs=req.logprobs))
        prep = await _prepare(request, req, body, episode, [ids], sent, "chat", req.top_k if req.logprobs else 0)
        if req.top_logprobs and not req.logprobs:
            raise bad_request("top_logprobs needs logprobs: true", "top_logprobs")
        return await _respond(request, req, prep, chat=True, logprobs=req.logprobs, body=body)

    async def completions(request: Request, episode: str | None) -> Any:
        body = await _json(request)
        req = _parse(CompletionRequest, body)
        prompts = _completion_prompts(req.prompt)
        ids = [list(tokenizer(p, add_special_tokens=True)["input_ids"]) if isinstance(p, str) else p for p in prompts]
        texts = [p if isinstance(p, str) else tokenizer.decode(p) for p in prompts]
        sent = Sent(texts, texts, None, None, _sampling(req, logprobs=req.logprobs))
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

    async def _respond(request: Request, req, prep: _Prepared, *, chat: bool, logprobs: bool, body: dict) -> Any:
        headers = {"X-Agentmem-Invocation": ",".join(prep.planned.invocation_ids),
                   "X-Agentmem-Episode": ",".join(prep.planned.episode_ids)}
        if req.stream:
            return StreamingResponse(_stream(request, req, prep, chat, logprobs, body), headers=headers,
                                     media_type="text/event-stream")
        choices = await asyncio.wrap_future(sampler.submit(prep.job))
        await asyncio.to_thread(_store, prep, choices)
        out = _response(prep, choices, chat, logprobs, bool(body.get("return_token_ids")))
        return JSONResponse(out, headers=headers)

    def _store(prep: _Prepared, choices: list[Choice]) -> None:
        recorder.record(prep.ctx, prep.planned, choices, prep.sent, prep.job.params.temperature, prep.job.n)

    def _response(prep: _Prepared, choices: list[Choice], chat: bool, logprobs: bool, token_ids: bool) -> dict:
        out: dict[str, Any] = {
            "id": prep.planned.invocation_ids[0], "object": "chat.completion" if chat else "text_completion",
            "created": int(time.time()), "model": settings.model_name,
            "system_fingerprint": recorder.policy_version,
            "choices": [_choice(i, c, chat, logprobs, token_ids) for i, c in enumerate(choices)],
            "usage": _usage(prep, choices),
        }
        if token_ids:
            out["prompt_token_ids"] = prep.prompts[0] if len(prep.prompts) == 1 else prep.prompts
        return out

    def _choice(i: int, c: Choice, chat: bool, logprobs: bool, token_ids: bool) -> dict[str, Any]:
        out: dict[str, Any] = {"index": i, "finish_reason": c.finish_reason.value}
        if chat:
            out["message"] = {"role": "assistant", "content": c.text}
            out["logprobs"] = {"content": _chat_logprobs(c)} if logprobs else None
        else:
            out["text"] = c.text
            out["logprobs"] = _completion_logprobs(c) if logprobs else None
        if token_ids:
            out["token_ids"] = c.output_ids
        return out

    def _token(tid: int) -> str:
        return tokenizer.decode([tid])

    def _entry(tid: int, lp: float, top: list[tuple[int, float]] | None) -> dict[str, Any]:
        text = _token(tid)
        return {"token": text, "logprob": lp, "bytes": list(text.encode()),
                "top_logprobs": [{"token": _token(t), "logprob": v, "bytes": list(_token(t).encode())}
                                 for t, v in (top or [])]}

    def _chat_logprobs(c: Choice, start: int = 0, stop: int | None = None) -> list[dict[str, Any]]:
        lps = c.logprobs or [0.0] * len(c.output_ids)
        stop = len(c.output_ids) if stop is None else stop
        return [_entry(c.output_ids[k], lps[k], c.top[k] if c.top else None) for k in range(start, stop)]

    def _completion_logprobs(c: Choice) -> dict[str, Any]:
        lps = c.logprobs or [0.0] * len(c.output_ids)
        tokens = [_token(t) for t in c.output_ids]
        offsets, at = [], 0
        for t in tokens:
            offsets.append(at)
            at += len(t)
        top = [{_token(t): v for t, v in row} for row in c.top] if c.top else None
        return {"tokens": tokens, "token_logprobs": lps, "top_logprobs": top, "text_offset": offsets}

    def _usage(prep: _Prepared, choices: list[Choice]) -> dict[str, int]:
        prompt = sum(len(p) for p in prep.prompts)
        completion = sum(len(c.output_ids) for c in choices)
        return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}

    async def _stream(request: Request, req, prep: _Prepared, chat: bool, logprobs: bool,
                      body: dict) -> AsyncIterator[str]:
        inv_id, created = prep.planned.invocation_ids[0], int(time.time())
        kind = "chat.completion.chunk" if chat else "text_completion"

        def chunk(choices: list[dict[str, Any]], **extra: Any) -> str:
            data = {"id": inv_id, "object": kind, "created": created, "model": settings.model_name,
                    "system_fingerprint": recorder.policy_version, "choices": choices, **extra}
            return f"data: {json.dumps(data)}\n\n"

        try:
            choices = await asyncio.wrap_future(sampler.submit(prep.job))
        except Exception as exc:  # noqa: BLE001  the stream has started: the error goes in it, nothing is stored
            err = exc if isinstance(exc, ApiError) else ApiError(500, f"{type(exc).__name__}: {exc}", type="server_error")
            yield f"data: {json.dumps(err.body())}\n\n"
            return
        for i, c in enumerate(choices):
            if chat:
                yield chunk([{"index": i, "delta": {"role": "assistant", "content": ""}, "logprobs": None,
                              "finish_reason": None}])
            for k, delta in enumerate(_deltas(tokenizer, c)):
                piece: dict[str, Any] = {"index": i, "finish_reason": None}
                if chat:
                    piece["delta"] = {"content": delta}
                    piece["logprobs"] = {"content": _chat_logprobs(c, k, k + 1)} if logprobs else None
                else:
                    piece["text"] = delta
                    piece["logprobs"] = None
                yield chunk([piece])
                await asyncio.sleep(0)
        if await request.is_disconnected():
            return  # the client is gone: its call is not stored
        await asyncio.to_thread(_store, prep, choices)
        for i, c in enumerate(choices):
            last: dict[str, Any] = {"index": i, "finish_reason": c.finish_reason.value}
            if chat:
                last["delta"] = {}
                last["logprobs"] = None
            else:
                last["text"] = ""
            yield chunk([last])
        if (body.get("stream_options") or {}).get("include_usage"):
            yield chunk([], usage=_usage(prep, choices))
        yield "data: [DONE]\n\n"

    return app


def _deltas(tokenizer, c: Choice) -> list[str]:
    """One text delta per output token, whose concatenation is the choice's text: a token that decodes
    only together with later ones (part of a UTF-8 character) gives an empty delta until it completes."""
    out, sent = [], ""
    for k in range(1, len(c.output_ids) + 1):
        cur = tokenizer.decode(c.output_ids[:k], skip_special_tokens=True)[: len(c.text)]
        if c.text.startswith(cur) and len(cur) > len(sent):
            out.append(cur[len(sent):])
            sent = cur
        else:
            out.append("")
    if sent != c.text and out:
        out[-1] += c.text[len(sent):]
    return out


def _sampling(req, **extra: Any) -> dict[str, Any]:
    """The sampling fields as the client gave them (None: the default), for ``serve_calls.sampling``."""
    fields = {"temperature": req.temperature, "top_p": req.top_p, "max_tokens": req.output_limit, "seed": req.seed,
              "stop": req.stops or None, "n": req.n, **extra}
    return {k: v for k, v in fields.items() if v is not None}


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
