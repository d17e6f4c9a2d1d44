"""The typer application and its error boundary.

Errors: an ``AgentmemError`` (any area: store, env, replay, policy, config, run, training) or a pydantic
validation error of a job's config is the user's to fix: it prints as one ``error:`` line and exits 1; a
usage error (unknown flag, bad value) prints as one ``error:`` line and exits 2 (``cli.command``).
Anything else is a bug and keeps its traceback. ``--debug`` (or ``AGENTMEM_DEBUG=1``) prints the whole
traceback for every error. Hub downloads are off unless ``HF_HUB_OFFLINE`` says otherwise.

Ctrl-C and SIGTERM: typer turns a ``KeyboardInterrupt`` that leaves a command into a silent exit 130, so the
jobs print their one ``interrupted:`` line themselves, inside the command (``cli.job_session``).
"""

from __future__ import annotations

import os
import sys
from typing import Annotated

import typer

from cli import command
from cli import config_show as config_commands
from cli import db as db_commands
from cli import distill as distill_commands
from cli import evaluate as evaluate_commands
from cli import inspect as inspect_commands
from cli import memories as memories_commands
from cli import models as models_commands
from cli import report as report_commands
from cli import rollout as rollout_commands
from cli import score as score_commands
from cli import serve as serve_commands
from cli import sft as sft_commands
from cli import train as train_commands
from cli import view as view_commands
from cli import worker as worker_commands

app = typer.Typer(
    name="agentmem",
    help="Train memory-rewriting LLM agents: collect rollouts into a typed invocation store, replay them "
    "with exact state alignment, score with a teacher and distill.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
    cls=command.Group,
)
app.add_typer(db_commands.app, name="db")
config_commands.register(app)
distill_commands.register(app)
evaluate_commands.register(app)
inspect_commands.register(app)
memories_commands.register(app)
models_commands.register(app)
report_commands.register(app)
rollout_commands.register(app)
score_commands.register(app)
serve_commands.register(app)
sft_commands.register(app)
train_commands.register(app)
view_commands.register(app)
worker_commands.register(app)

_DEBUG = {"on": False}


@app.callback()
def _options(
    debug: Annotated[bool, typer.Option("--debug", help="Print the full traceback of any error.")] = False,
) -> None:
    _DEBUG["on"] = debug or bool(os.environ.get("AGENTMEM_DEBUG"))


def error_message(exc: BaseException) -> str:
    """One line for a user error: a pydantic validation error names the flag at fault (``--episodes``), not
    the config field behind it."""
    from pydantic import ValidationError

    from cli.config_options import flag_of

    if isinstance(exc, ValidationError):
        parts = []
        for err in exc.errors():
            names = [str(x) for x in err["loc"] if not isinstance(x, int)]
            if names and err["type"] == "missing":
                parts.append(f"{flag_of(names[-1])} is required")
            else:
                parts.append(f"{flag_of(names[-1])}: {err['msg']}" if names else err["msg"])
        return "; ".join(parts)
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def main() -> None:
    from pydantic import ValidationError

    from agentmem.errors import AgentmemError

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from cli.config_options import CommandLineError

    try:
        app()
    except (AgentmemError, ValidationError) as exc:
        if _DEBUG["on"]:
            raise
        typer.echo(f"error: {error_message(exc)}", err=True)
        sys.exit(2 if isinstance(exc, CommandLineError) else 1)


if __name__ == "__main__":
    main()
