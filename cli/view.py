"""``agentmem view``: browse the store in a local, read-only web app."""

from __future__ import annotations

from typing import Annotated

import typer

from cli.options import DbOption

TokenizerOption = Annotated[
    str | None,
    typer.Option(help="Model folder (or tokenizer.json) whose tokenizer shows the text of scored tokens. "
                      "Default: the folder of the checkpoint that sampled each call; without one, tokens show "
                      "as ids.", show_default=False),
]


def view(
    db: DbOption = None,
    host: Annotated[str, typer.Option(help="Address to listen on (127.0.0.1: this machine only).")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="Port to listen on.", min=1, max=65535)] = 8000,
    tokenizer: TokenizerOption = None,
) -> None:
    """Browse runs, episodes, calls, teacher scores and training curves in a web browser. The store is
    opened read-only: nothing a page does can change it."""
    from cli.common import check_port

    check_port(host, port)  # before the web app's imports: a port in use answers at once
    import uvicorn

    from agentmem.view.app import create_app
    from store.engine import open_read_only, sqlite_file

    store = open_read_only(db)
    where = sqlite_file(db) or store.url
    typer.echo(f"agentmem view: http://{host}:{port}/  (reading {where}, read-only; Ctrl-C stops)")
    uvicorn.run(create_app(store, tokenizer=tokenizer), host=host, port=port, log_level="warning")


def register(app: typer.Typer) -> None:
    app.command()(view)
