"""The FastAPI app of ``agentmem serve``: OpenAI routes that record every call before answering it.

Routes, one router module per API (``routes/``), each ``/v1/...`` route also answering under
``/episodes/{episode}/v1/...``, the episode then being the path's, so an agent changes only its ``base_url``:
- ``POST /v1/chat/completions`` (``routes/chat.py``), ``POST /v1/completions`` (``routes/completions.py``),
  ``POST /v1/responses`` (``routes/responses.py``), ``GET /v1/models`` (``routes/models.py``); their options:
  ``protocol.py``; checks, generation and storing: ``calls.py``;
- ``POST /agentmem/episodes/{episode}/reward`` and ``.../privileged`` (``routes/episodes.py``);
- ``GET /health`` (a gateway's: each upstream's status too, and 503 while none is up);
- ``GET /openapi.json``: every route, header and request body (``openapi.py``).

Authentication: with an API key every route, ``/health`` included, needs ``Authorization: Bearer KEY`` or
``api-key: KEY``. An unknown route answers 404 and a wrong method 405, with the OpenAI error body.

Episodes: the URL path, else the ``X-Agentmem-Episode`` header, else ``metadata.agentmem_episode`` (or
``metadata.episode``) in the body; task and kind likewise (``X-Agentmem-Task``/``X-Agentmem-Kind``,
``metadata.task``/``metadata.kind``); ``X-Agentmem-Parent`` names the call this one continues. Every
response names its invocation: the ``id`` field and ``X-Agentmem-Invocation`` (comma-separated per choice
for ``n > 1``), and ``X-Agentmem-Episode`` the episode row id(s). ``"return_token_ids": true`` in the body
(vLLM's flag) adds ``prompt_token_ids`` and each choice's ``token_ids`` to a non-streaming response.
``X-Agentmem-Reopen: true`` (or ``metadata.agentmem_reopen``) lets a call continue an episode that was
rewarded, which goes back to ``running`` without its reward; without it such a call gets 409.

Storing: a non-streaming call is stored before its response is sent. A streaming call sends its tokens,
is stored, then sends its last chunk (with the finish reason) and ``[DONE]``; a client gone before that has
nothing stored. Errors answer with the OpenAI status and ``{"error": {...}}`` body.
"""

from __future__ import annotations

import logging

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException

from agentmem.serve.calls import Calls, ServeSettings, validation_error
from agentmem.serve.openapi import openapi
from agentmem.serve.protocol import ApiError, bad_request, server_error
from agentmem.serve.recorder import Recorder
from agentmem.serve.routes import chat, completions, episodes, models, responses
from agentmem.serve.sampler import Sampler
from store.errors import ValueOutOfBounds

__all__ = ["ServeSettings", "create_app"]

OPENAI_ROUTERS = (chat.router, completions.router, responses.router, models.router)


def create_app(sampler: Sampler, recorder: Recorder, tokenizer, settings: ServeSettings) -> FastAPI:
    app = FastAPI(title="agentmem serve", docs_url=None, redoc_url=None, openapi_url=None)
    app.state.calls = Calls(sampler, recorder, tokenizer, settings)
    for router in OPENAI_ROUTERS:
        app.include_router(router, prefix="/v1")
        app.include_router(router, prefix="/episodes/{episode}/v1")
    app.include_router(episodes.router)

    document = openapi()

    @app.get("/openapi.json")
    async def openapi_json() -> JSONResponse:
        return JSONResponse(document)

    @app.get("/health")
    async def health() -> JSONResponse:
        body: dict = {"status": "ok", "run": recorder.run_id}
        if hasattr(sampler, "health"):  # a gateway: each upstream, and 503 while none is up
            body["upstreams"] = sampler.health()
            if not any(u["status"] == "up" for u in body["upstreams"]):
                body["status"] = "down"
        return JSONResponse(body, status_code=200 if body["status"] == "ok" else 503)

    @app.exception_handler(ApiError)
    async def _api_error(_request: Request, exc: ApiError) -> JSONResponse:
        return JSONResponse(exc.body(), status_code=exc.status)

    @app.exception_handler(HTTPException)
    async def _http_error(request: Request, exc: HTTPException) -> JSONResponse:
        # an unknown route (404) or method (405), in the OpenAI shape
        message = (f"unknown route: {request.method} {request.url.path}" if exc.status_code == 404
                   else f"{request.method} {request.url.path}: {exc.detail}")
        err = ApiError(exc.status_code, message, type="invalid_request_error",
                       code="not_found" if exc.status_code == 404 else None)
        return JSONResponse(err.body(), status_code=exc.status_code, headers=getattr(exc, "headers", None))

    @app.exception_handler(ValueOutOfBounds)
    async def _out_of_bounds(_request: Request, exc: ValueOutOfBounds) -> JSONResponse:
        # a value the store refused (store.bounds): the client's, nothing written
        return JSONResponse(bad_request(str(exc), exc.field).body(), status_code=400)

    @app.exception_handler(Exception)
    async def _server_error(request: Request, exc: Exception) -> JSONResponse:
        # a failed generation or store write: the OpenAI body without the details (the whole error goes to the
        # server's log), and nothing stored (one transaction per call)
        logging.getLogger("agentmem.serve").error("%s %s failed", request.method, request.url.path, exc_info=exc)
        return JSONResponse(server_error(exc).body(), status_code=500)

    @app.exception_handler(RequestValidationError)
    async def _invalid(_request: Request, exc: RequestValidationError) -> JSONResponse:
        return JSONResponse(validation_error(list(exc.errors())).body(), status_code=400)

    @app.middleware("http")
    async def _auth(request: Request, call_next):
        if settings.api_key is not None and not _authorized(request, settings.api_key):
            err = ApiError(401, "invalid or missing API key: send Authorization: Bearer KEY (or api-key: KEY)",
                           type="invalid_request_error", code="invalid_api_key")
            return JSONResponse(err.body(), status_code=401)
        try:
            return await call_next(request)
        except Exception as exc:  # noqa: BLE001  answered here: raised further, it would reset the connection
            return await _server_error(request, exc)

    return app


def _authorized(request: Request, key: str) -> bool:
    h = request.headers
    return h.get("authorization", "") == f"Bearer {key}" or h.get("api-key") == key
