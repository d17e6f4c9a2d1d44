"""The typer application and its error boundary."""

from __future__ import annotations

import os
import sys

import typer

from cli import db as db_commands
from cli import distill as distill_commands
from cli import evaluate as evaluate_commands
from cli import inspect as inspect_commands
from cli import models as models_commands
from cli import rollout as rollout_commands
from cli import score as score_commands
from cli import train as train_commands

app = typer.Typer(
    name="agentmem",
    help="Train memory-rewriting LLM agents: collect rollouts into a typed invocation store, replay them "
    "with exact state alignment, score with a teacher and distill.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)
app.add_typer(db_commands.app, name="db")
distill_commands.register(app)
evaluate_commands.register(app)
inspect_commands.register(app)
models_commands.register(app)
rollout_commands.register(app)
score_commands.register(app)
train_commands.register(app)


def _user_errors() -> tuple[type[BaseException], ...]:
    from store.errors import StoreError

    return (StoreError, ValueError, FileNotFoundError, PermissionError, KeyError)


def main() -> None:
    try:
        app()
    except KeyboardInterrupt:
        typer.echo("interrupted: finished work is stored; re-run with --resume to continue", err=True)
        sys.exit(130)
    except _user_errors() as exc:
        if os.environ.get("AGENTMEM_DEBUG"):
            raise
        message = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        typer.echo(f"error: {message}", err=True)
        sys.exit(1)


if __name__ == "__main__":
    main()
