"""``agentmem serve``: an OpenAI-compatible endpoint that records every call as an exact invocation.

Heavy modules (fastapi, uvicorn, torch, the model) are imported inside the command, after the flags are
checked, so the CLI starts fast and a bad flag fails before any model loads.
"""

from __future__ import annotations

import os
from typing import Annotated

import typer

from agentmem.config import Device
from cli.config_options import job_command, job_config
from cli.job_specs import SERVE
from cli.options import DbOption, DeviceOption, ThreadsOption

API_KEY_VAR = "AGENTMEM_API_KEY"
UPSTREAM_KEY_VAR = "AGENTMEM_UPSTREAM_API_KEY"
SERVE_PORT = 8001  # `agentmem view` listens on 8000: both run side by side with their defaults


@job_command(SERVE)
def serve(
    ctx: typer.Context,
    db: DbOption = None,
    host: Annotated[str, typer.Option(help="Address to listen on (127.0.0.1: this machine only).")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="Port to listen on (8001: `agentmem view` keeps 8000).", min=1,
                                      max=65535)] = SERVE_PORT,
    api_key: Annotated[str | None, typer.Option(help=f"Require `Authorization: Bearer KEY` or `api-key: KEY` on "
                                                     f"every route (default ${API_KEY_VAR}; unset: no key).",
                                                show_default=False)] = None,
    upstream_api_key: Annotated[str | None, typer.Option(help=f"The key sent to the upstreams (default "
                                                              f"${UPSTREAM_KEY_VAR}).", show_default=False)] = None,
    device: DeviceOption = Device.auto,
    threads: ThreadsOption = None,
) -> None:
    """Serve a model through the OpenAI API (`/v1/chat/completions`, `/v1/completions`, `/v1/responses`,
    `/v1/models`) and store every call as an invocation of one `serve` run: an agent written with any OpenAI
    client changes only its base URL (`http://HOST:PORT/episodes/EPISODE/v1` groups its calls into an episode). See
    docs/serve.md."""
    from cli.common import check_port, runtime, setup_logging

    config = job_config(ctx)
    check_port(host, port)  # before the server's imports and the model: a port in use answers at once
    key = api_key or os.environ.get(API_KEY_VAR) or None
    setup_logging()
    rt = runtime(device, threads)

    from agentmem.serve.server import build_server
    from store.engine import open_store

    store = open_store(db, create=True)
    server = build_server(store, config, rt, api_key=key,
                          upstream_api_key=upstream_api_key or os.environ.get(UPSTREAM_KEY_VAR) or None)
    auth = "bearer key required" if key else "no key"
    typer.echo(f"agentmem serve: http://{host}:{port}/v1  model={config.name}  run_id={server.run_id}  ({auth}; "
               "Ctrl-C or SIGTERM stops)")
    status = server.serve(host, port)
    resume = f"; --run-name {config.run_name} continues it" if config.run_name else ""
    typer.echo(f"agentmem serve: stopped, run {server.run_id} {status}{resume}")


def register(app: typer.Typer) -> None:
    app.command()(serve)
