"""Options shared by every command."""

from __future__ import annotations

from typing import Annotated

import typer

DbOption = Annotated[
    str | None,
    typer.Option(
        "--db",
        help="Database URL: sqlite:///PATH (default sqlite:///agentmem.db) or postgresql://USER@HOST/DB. "
        "Defaults to $AGENTMEM_DB.",
        show_default=False,
    ),
]
