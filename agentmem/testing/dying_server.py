"""An ``agentmem serve`` server that dies in the middle of a call, for the fault tests of several servers.

``python -m agentmem.testing.dying_server MODEL_DIR DB_URL PORT CALL`` serves MODEL_DIR (transformers, float32,
greedy-exact: no batch window) on 127.0.0.1:PORT and prints ``ready`` once it listens; when its ``CALL``-th
``/v1/completions`` request has arrived, it kills itself with SIGKILL before answering, as a server whose machine
fails mid-call (the client sees its connection reset).
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time

import uvicorn

from agentmem.serve.server import ServeConfig, build_server
from agentmem.testing.serving import dies_at
from store.engine import open_store


def main() -> None:
    model, db, port, call = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    server = build_server(open_store(db, create=True), ServeConfig(model=model, dtype="float32", batch_window_ms=0))
    app = dies_at(server.app, call, lambda: os.kill(os.getpid(), signal.SIGKILL))
    web = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=web.run, daemon=True)
    thread.start()
    while not web.started:
        time.sleep(0.02)
    print("ready", flush=True)
    thread.join()


if __name__ == "__main__":
    main()
