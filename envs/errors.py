"""The one error type of the environments package.

Invariant: every failure to build an environment (unknown name or knob, missing or malformed data file,
bad knob value) is an ``EnvError`` whose message names the file, the record and the field where one
applies, so the CLI can print it as a single line.
"""

from __future__ import annotations

from agentmem.errors import AgentmemError


class EnvError(AgentmemError, ValueError):
    """An environment cannot be built or a data file cannot be read."""


def check_int(what: str, value: object, low: int, *, optional: bool = False) -> None:
    """Raise ``EnvError("<what> must be [None or ]an integer >= <low>, got <value>")`` unless ``value`` is
    an int (not a bool) of at least ``low``, or None when ``optional``."""
    if optional and value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        none = "None or " if optional else ""
        raise EnvError(f"{what} must be {none}an integer >= {low}, got {value!r}")
