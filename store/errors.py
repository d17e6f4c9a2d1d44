"""Typed store errors; the CLI turns each into one line and a non-zero exit code."""

from agentmem.errors import AgentmemError


class StoreError(AgentmemError):
    """Base class: a store operation failed for a reason the user can act on."""


class StoreUnavailable(StoreError):
    """The database URL is malformed or the server cannot be reached."""


class SchemaOutOfDate(StoreError):
    """The database schema is missing or behind the code's migrations."""


class NotFound(StoreError):
    """A named row (run, episode, checkpoint) does not exist."""


class ReadOnlyDatabase(StoreError):
    """The database (a SQLite file, or its folder) cannot be written."""
