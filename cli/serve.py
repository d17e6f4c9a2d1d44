"""``agentmem serve``: an OpenAI-compatible endpoint that records every call as an exact invocation.

Heavy modules (fastapi, uvicorn, torch, the model) are imported inside the command, after the flags are
checked, so the CLI starts fast and a bad flag fails before any model loads.
"""

from __future__ import annotations

import os
from typing import Annotated

import typer

from agentmem.config import BackendKind, Device, DType
from cli.options import DbOption, DeviceOption, ThreadsOption

API_KEY_VAR = "AGENTMEM_API_KEY"
UPSTREAM_KEY_VAR = "AGENTMEM_UPSTREAM_API_KEY"
SERVE_PORT = 8001  # `agentmem view` listens on 8000: both run side by side with their defaults


def serve(
    model: Annotated[str | None, typer.Option(help="Model to serve: a checkpoint id, a model folder or `default`.",
                                              show_default=False)] = None,
    backend: Annotated[BackendKind, typer.Option(
        help="Generation backend (vllm: its async engine, in this process).")] = BackendKind.transformers,
    db: DbOption = None,
    host: Annotated[str, typer.Option(help="Address to listen on (127.0.0.1: this machine only).")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="Port to listen on (8001: `agentmem view` keeps 8000).", min=1,
                                      max=65535)] = SERVE_PORT,
    run_name: Annotated[str | None, typer.Option(help="Name of the serve run: restarting with the same name "
                                                      "continues the same run (default: a new run).",
                                                 show_default=False)] = None,
    api_key: Annotated[str | None, typer.Option(help=f"Require `Authorization: Bearer KEY` or `api-key: KEY` on "
                                                     f"every route (default ${API_KEY_VAR}; unset: no key).",
                                                show_default=False)] = None,
    served_model_name: Annotated[str | None, typer.Option(help="The `model` name clients send (default: the "
                                                               "--model value, or `default`).",
                                                          show_default=False)] = None,
    max_n: Annotated[int, typer.Option(help="Largest `n` (samples per call) a request may ask.", min=1)] = 16,
    max_tokens: Annotated[int, typer.Option(help="Output tokens of a request that gives no max_tokens.",
                                            min=1)] = 256,
    batch_window_ms: Annotated[float, typer.Option(help="transformers, when no batch runs: a request waits until "
                                                        "none has arrived for this long (at most 10 times it) for "
                                                        "others to start a batch with.", min=0)] = 5.0,
    max_body_mb: Annotated[float, typer.Option(help="Largest request body, in MB: a longer one is refused (413) "
                                                    "before it is read.", min=0.001)] = 4.0,
    continuous_batching: Annotated[bool, typer.Option(
        "--continuous-batching/--static-batching",
        help="transformers: requests of plain sampling join the running batch between decoding steps; "
             "static: each batch is fixed when it starts, later requests wait for it to end.")] = True,
    upstream: Annotated[list[str] | None, typer.Option(
        help="Gateway mode: forward generation to this vLLM or agentmem OpenAI server (e.g. "
             "http://127.0.0.1:8002/v1) instead of loading the model; --model then gives only the tokenizer and "
             "chat template. Repeat it for several upstreams (an episode's calls stay on one).",
        show_default=False)] = None,
    upstream_text: Annotated[bool, typer.Option(
        help="The upstreams return no token ids (a hosted API): the chat goes to their /chat/completions under "
             "the served name, the reply text is tokenized locally and stored not replayable (sft, not distill).")] = False,
    upstream_wait: Annotated[float, typer.Option(help="Seconds start-up waits, retrying with backoff, for a first "
                                                      "upstream to answer.", min=0)] = 60.0,
    upstream_api_key: Annotated[str | None, typer.Option(help=f"The key sent to the upstreams (default "
                                                              f"${UPSTREAM_KEY_VAR}).", show_default=False)] = None,
    chat_template: Annotated[str | None, typer.Option(
        help="A Jinja chat template FILE replacing the model's own (or `chatml_tools`, shipped: ChatML with "
             "Hermes tool calls, for the default model): a request with tools its template cannot render is "
             "refused.", show_default=False, metavar="FILE")] = None,
    dtype: Annotated[DType, typer.Option(help="Model dtype (fp32, as rollouts: the stored log-probs then match "
                                              "training's fp32 recompute).")] = DType.float32,
    device: DeviceOption = Device.auto,
    threads: ThreadsOption = None,
) -> None:
    """Serve a model through the OpenAI API (`/v1/chat/completions`, `/v1/completions`, `/v1/responses`,
    `/v1/models`) and store every call as an invocation of one `serve` run: an agent written with any OpenAI
    client changes only its base_url (`http://HOST:PORT/episodes/EPISODE/v1` groups its calls into an episode). See
    docs/serve.md."""
    from cli.common import check_port, runtime, setup_logging

    check_port(host, port)  # before the server's imports and the model: a port in use answers at once
    from agentmem.serve.server import ServeConfig

    config = ServeConfig(model=model, served_model_name=served_model_name, backend=backend, dtype=dtype,
                         run_name=run_name, max_n=max_n, default_max_tokens=max_tokens,
                         batch_window_ms=batch_window_ms, continuous_batching=continuous_batching,
                         upstream=upstream, upstream_text=upstream_text,
                         upstream_wait_s=upstream_wait, chat_template=chat_template, max_body_mb=max_body_mb)
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
    resume = f"; --run-name {run_name} continues it" if run_name else ""
    typer.echo(f"agentmem serve: stopped, run {server.run_id} {status}{resume}")


def register(app: typer.Typer) -> None:
    app.command()(serve)
