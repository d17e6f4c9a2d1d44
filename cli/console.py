"""One rich console for the CLI: when stdout is not a terminal (pipes, tests), lines are not cut."""

from __future__ import annotations

import sys

from rich.console import Console


def console(stderr: bool = False) -> Console:
    stream = sys.stderr if stderr else sys.stdout
    return Console(stderr=stderr, width=None if stream.isatty() else 250)
