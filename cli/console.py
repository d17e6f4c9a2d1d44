"""One rich console for the CLI: ``$COLUMNS`` sets its width; without it, when stdout is not a terminal (pipes,
tests), lines are not cut."""

from __future__ import annotations

import os
import sys

from rich.console import Console


def console(stderr: bool = False) -> Console:
    """The console of ``stdout`` (or ``stderr``): as wide as the terminal, or as ``$COLUMNS`` says when it is
    set (``COLUMNS=80 agentmem show episode ID | less``), else 250 columns on a pipe."""
    stream = sys.stderr if stderr else sys.stdout
    columns = os.environ.get("COLUMNS", "")
    width = int(columns) if columns.isdigit() and int(columns) > 0 else None if stream.isatty() else 250
    return Console(stderr=stderr, width=width)
