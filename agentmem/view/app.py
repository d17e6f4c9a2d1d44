"""The FastAPI app of ``agentmem view``: the page routers, the static files, and error pages (an unknown id
or path is a 404 page, a bad query parameter a 400 page). The store is only read (open it with
``store.engine.open_read_only``); each request uses one short session."""

from __future__ import annotations

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import HTMLResponse
from fastapi.staticfiles import StaticFiles
from starlette.exceptions import HTTPException

from agentmem.view import compare, episode, run_page, runs, training
from agentmem.view.render import STATIC, Links, render
from store.engine import Store
from store.errors import NotFound


def error_page(status: int, message: str) -> HTMLResponse:
    title = {404: "not found", 400: "bad request"}.get(status, "error")
    return HTMLResponse(render("error.html", links=Links(), title=title, status=status, message=message),
                        status_code=status)


def create_app(store: Store, *, tokenizer: str | None = None) -> FastAPI:
    """The app over ``store``. ``tokenizer``: a model folder (or ``tokenizer.json``) whose tokenizer shows
    the text of scored tokens (default: each call's checkpoint folder)."""
    app = FastAPI(title="agentmem view", docs_url=None, redoc_url=None, openapi_url=None)
    app.state.store, app.state.tokenizer = store, tokenizer
    app.mount("/static", StaticFiles(directory=STATIC), name="static")
    for module in (runs, run_page, episode, compare, training):
        app.include_router(module.router)

    @app.exception_handler(NotFound)
    async def not_found(_request: Request, exc: NotFound) -> HTMLResponse:
        return error_page(404, str(exc))

    @app.exception_handler(HTTPException)
    async def http_error(_request: Request, exc: HTTPException) -> HTMLResponse:
        return error_page(exc.status_code, "no such page" if exc.status_code == 404 else str(exc.detail))

    @app.exception_handler(RequestValidationError)
    async def bad_query(_request: Request, exc: RequestValidationError) -> HTMLResponse:
        problems = "; ".join(f"{'.'.join(str(x) for x in e['loc'][1:])}: {e['msg']}" for e in exc.errors())
        return error_page(400, problems)

    return app
