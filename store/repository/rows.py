"""What the record modules share: how text columns are stored, idempotent inserts, and a row by its
(possibly abbreviated) id."""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.orm import Session

from store.bounds import LIMITS, check_length
from store.errors import NotFound


def text_column(value: str | None) -> str | None:
    """Text columns are for people (replay reads the ids): a NUL, which a byte-level tokenizer can decode
    and Postgres text cannot hold, is stored as U+FFFD on every database alike."""
    return value.replace("\x00", "\ufffd") if value else value


def check_row(table: str, row: dict[str, Any], where: str = "") -> dict[str, Any]:
    """``row`` (column -> value) of ``table`` when every bounded string column in it holds its value on every
    database (``store.bounds``); ``ValueOutOfBounds`` naming the column otherwise, before anything is written."""
    for name, value in row.items():
        if isinstance(value, str) and f"{table}.{name}" in LIMITS:
            check_length(value, f"{table}.{name}", name, where)
    return row


def insert_ignore(session: Session, table: sa.Table, rows: list[dict[str, Any]]) -> None:
    if not rows:
        return
    dialect = session.get_bind().dialect.name
    insert = postgresql.insert if dialect == "postgresql" else sqlite.insert
    session.execute(insert(table).on_conflict_do_nothing(), rows)


def get_row(session: Session, model: type[Any], ident: str, what: str, hint: str = ""):
    """The row with id ``ident``, or the only row whose id starts with it (ids may be abbreviated, as in
    git, to 6 or more characters)."""
    row = session.get(model, ident)
    if row is None and len(ident) < 6:
        raise NotFound(f"{what} id {ident!r} is too short: ids may be abbreviated to 6 or more characters{hint}")
    if row is None:
        rows = session.scalars(sa.select(model).where(model.id.startswith(ident, autoescape=True)).limit(2)).all()
        if len(rows) == 2:
            raise NotFound(f"{what} id {ident!r} is ambiguous: give more characters")
        row = rows[0] if rows else None
    if row is None:
        raise NotFound(f"no {what} with id {ident!r}{hint}")
    return row
