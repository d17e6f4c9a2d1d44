"""The store's bounds, stated once: what each bounded column holds, checked the same way on every database.

SQLite stores a string of any length in a ``VARCHAR(255)`` column, a NUL inside any text, and ``inf`` in a
float column; Postgres refuses the first two (a ``DataError`` after the work is done) and stores the third.
So the writers check their values here, before anything is written, and get the same answer on both:

- ``LIMITS``: the length of every bounded string column, read from the ORM (``store.orm``), by
  ``table.column``; ``check_length`` refuses a longer value (``ValueOutOfBounds`` naming the limit);
- text meant for people (prompts, outputs, memories, predictions) keeps a NUL as U+FFFD on every database
  (``rows.text_column``); an id-like string column refuses it (``check_length`` does both checks);
- ``check_finite`` and ``check_unit``: a stored reward or metric is a finite number, an F1-like one in
  [0, 1].

Callers at the edge (``agentmem serve``) check requests against the same bounds, so a client gets a 400
naming the limit before any generation runs.
"""

from __future__ import annotations

import math

import sqlalchemy as sa

from store.errors import ValueOutOfBounds
from store.orm import Base


def _limits() -> dict[str, int]:
    found: dict[str, int] = {}
    for table in Base.metadata.sorted_tables:
        for column in table.columns:
            length = getattr(column.type, "length", None)
            if isinstance(column.type, sa.String) and length is not None:
                found[f"{table.name}.{column.name}"] = int(length)
    return found


LIMITS: dict[str, int] = _limits()
"""``table.column`` -> the most characters the column holds (``episodes.task_id``: 255, ``invocations.kind``:
32, ...)."""

UNIT_METRICS = ("f1", "em", "sub_em")
"""An episode's F1-like scores: each in [0, 1]."""


def limit(column: str) -> int:
    """The length of the bounded column ``column`` (``table.column``)."""
    return LIMITS[column]


def check_length(value: str, column: str, field: str, where: str = "") -> str:
    """``value`` when the column ``column`` holds it on every database: at most its length in characters and
    no NUL; else ``ValueOutOfBounds`` naming ``field`` (the value as the caller's user knows it, after
    ``where`` in the message) and the limit."""
    size = limit(column)
    if len(value) > size:
        raise ValueOutOfBounds(field, f"{where}{field} is {len(value)} characters long: at most {size} are stored "
                                      f"({column} is VARCHAR({size}))")
    if "\x00" in value:
        raise ValueOutOfBounds(field, f"{where}{field} contains a NUL character (\\u0000), which {column} cannot "
                                      "hold")
    return value


def check_finite(value: float | None, field: str, where: str = "") -> float | None:
    """``value`` (None passes) when it is a finite number, else ``ValueOutOfBounds`` naming ``field``."""
    if value is not None and not math.isfinite(value):
        raise ValueOutOfBounds(field, f"{where}{field} must be a finite number, got {value}")
    return value


def check_unit(value: float | None, field: str, where: str = "") -> float | None:
    """``value`` (None passes) when it is a finite number in [0, 1] (an F1, EM or substring EM)."""
    check_finite(value, field, where)
    if value is not None and not 0.0 <= value <= 1.0:
        raise ValueOutOfBounds(field, f"{where}{field} must lie in [0, 1], got {value}")
    return value


def check_outcome(reward: float | None, scores: dict[str, float | None], where: str = "") -> None:
    """An episode's outcome as the store takes it: a finite ``reward`` and F1-like ``scores`` (by name) in
    [0, 1]; ``where`` begins the message (``"episode ID: "``)."""
    check_finite(reward, "reward", where)
    for name, value in scores.items():
        check_unit(value, name, where)
