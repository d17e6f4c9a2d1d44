"""An ``agentmem serve`` app (any ASGI app) on a free local port in a thread, for tests and benchmarks that
drive it over HTTP."""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Callable, Iterator

import uvicorn


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def running(app, port: int | None = None) -> Iterator[str]:
    """Serve ``app`` on 127.0.0.1; yields its root URL (``http://127.0.0.1:PORT``)."""
    port = port or free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        if time.monotonic() > deadline or not thread.is_alive():
            raise RuntimeError("the test server did not start")
        time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=30)


def dies_at(app, call: int, die: Callable[[], None] | None = None):
    """``app`` until its ``call``-th ``/completions`` request has arrived; then that request and every later
    one get ``die()`` (default: an exception, so the server answers 500; ``agentmem.testing.dying_server``
    passes a SIGKILL of its own process: a server that dies mid-call)."""
    seen = 0

    def fail() -> None:
        raise RuntimeError("this server has died")

    async def wrapped(scope, receive, send):
        nonlocal seen
        if scope["type"] == "http" and scope["path"].endswith("/completions"):
            seen += 1
            if seen >= call:
                await receive()  # the request has arrived: the server dies while it holds it
                (die or fail)()
        await app(scope, receive, send)

    return wrapped
