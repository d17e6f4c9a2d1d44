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


class StoreFull(StoreError):
    """A write failed because the disk is full or the file hit its size limit; what was committed before is
    intact and readable."""


class ValueOutOfBounds(StoreError, ValueError):
    """A value a column cannot hold the same way on every database (too long, a NUL in an id, a reward that is
    not finite, an F1 outside [0, 1]): nothing was written. ``field`` names the value as the caller knows it."""

    def __init__(self, field: str, message: str):
        super().__init__(message)
        self.field = field


class StoredRowError(StoreError, ValueError):
    """A stored row a job cannot read or train on (a value of another schema, a broken array, a reward that is
    not finite): the message names its run, the row and the column."""


class LeaseLost(StoreError):
    """A rollout worker wrote for episodes it no longer holds (its lease was taken over): nothing was
    written for them; the worker must drop them, in-memory state and all."""

    def __init__(self, owner: str, episode_ids: set[str]):
        self.owner, self.episode_ids = owner, set(episode_ids)
        shown = ", ".join(sorted(self.episode_ids)[:3]) + (" ..." if len(self.episode_ids) > 3 else "")
        super().__init__(f"worker {owner} lost the lease of {len(self.episode_ids)} episode(s) ({shown}): "
                         "another worker took them over; their calls were not stored")
