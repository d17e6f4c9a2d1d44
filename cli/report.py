"""``agentmem report``: one run as one self-contained HTML file."""

from __future__ import annotations

from typing import Annotated

import typer

from cli.options import DbOption
from cli.view import TokenizerOption


def report(
    run: Annotated[str, typer.Option("--run", help="Run id (abbreviations allowed; see `agentmem runs`).")],
    out: Annotated[str, typer.Option(help="HTML file to write.")] = "report.html",
    episodes: Annotated[int, typer.Option("--full-episodes", help="Show this many episodes in full (all are in the "
                                                              "table).", min=0)]
    = 20,
    tokenizer: TokenizerOption = None,
    db: DbOption = None,
) -> None:
    """Write one run's episodes, calls, teacher-score heat maps and training plots to one HTML file with no
    external references (inline CSS and SVG), to open anywhere or attach."""
    from agentmem.view.report import write_report
    from store.engine import open_read_only

    path = write_report(open_read_only(db), run, out, max_episodes=episodes, tokenizer=tokenizer)
    typer.echo(f"wrote {path}")


def register(app: typer.Typer) -> None:
    app.command()(report)
