"""The one error type of the environments package.

Invariant: every failure to build an environment (unknown name or knob, missing or malformed data file,
bad knob value) is an ``EnvError`` whose message names the file, the record and the field where one
applies, so the CLI can print it as a single line.
"""

from __future__ import annotations


class EnvError(ValueError):
    """An environment cannot be built or a data file cannot be read."""
