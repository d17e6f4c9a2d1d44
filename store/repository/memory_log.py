"""Repository functions of table ``memory_log``: the ``log`` memory policy's episode logs, one row per entry.

Entries are appended verbatim and never changed. A row's id is derived from (episode, seq), and an entry
whose id or (episode, seq) is stored already is skipped, so a resumed rollout can re-offer entries and the
log of a resumed episode equals an uninterrupted one's. As in every text column, a NUL is stored as U+FFFD
(Postgres text cannot hold it). The caller owns the transaction: the rollout writes
a call's entries in the transaction that stores the call.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable

import sqlalchemy as sa
from sqlalchemy.orm import Session

from agentmem.records import LogEntry
from store.orm import MemoryLogRow
from store.repository.rows import insert_ignore, text_column

_NAMESPACE = uuid.UUID("5d0c6f38-2a61-4d8e-9a55-6c0f4d7e9b21")


def entry_id(episode_id: str, seq: int) -> str:
    """The row id of entry ``seq`` of ``episode_id``'s log (an idempotency key)."""
    return uuid.uuid5(_NAMESPACE, f"{episode_id}\x00{seq}").hex


def insert_log_entries(session: Session, entries: Iterable[LogEntry]) -> None:
    """Append ``entries``; those stored already (same episode and seq) are skipped."""
    rows = [{**e.model_dump(mode="python"), "id": entry_id(e.episode_id, e.seq), "text": text_column(e.text)}
            for e in entries]
    insert_ignore(session, MemoryLogRow.__table__, rows)


def episode_log(session: Session, episode_id: str) -> list[LogEntry]:
    """The log of ``episode_id``, in ``seq`` order."""
    rows = session.scalars(sa.select(MemoryLogRow).where(MemoryLogRow.episode_id == episode_id)
                           .order_by(MemoryLogRow.seq)).all()
    return [LogEntry(episode_id=r.episode_id, seq=r.seq, source=r.source, text=r.text,
                     invocation_id=r.invocation_id, created_at=r.created_at) for r in rows]
