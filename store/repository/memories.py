"""Repository functions of the ``memories`` table: workflow memories with their provenance (records in and out).

As in ``store.repository``, every function takes the session and the caller owns the transaction. Inserts
are idempotent on the memory id (``agentmem.jobs.memories`` derives it from the build run and the source
episode), so a resumed build re-offers what it is not sure was written without duplicating a row.
A bank is listed in the order it was written (``created_at``, then id).
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from sqlalchemy.orm import Session

from agentmem.records import WorkflowMemory
from store.orm import MemoryRow
from store.repository.rows import insert_ignore, text_column


def insert_memories(session: Session, memories: Sequence[WorkflowMemory]) -> None:
    rows = [m.model_dump(mode="python") | {"question": text_column(m.question), "text": text_column(m.text)} for m in memories]
    insert_ignore(session, MemoryRow.__table__, rows)


def _memory(row: MemoryRow) -> WorkflowMemory:
    return WorkflowMemory(
        id=row.id, build_run_id=row.build_run_id, source_run_id=row.source_run_id,
        source_episode_id=row.source_episode_id, source_invocation_ids=list(row.source_invocation_ids),
        writer=row.writer, env=row.env, question=row.question, text=row.text, f1=row.f1, created_at=row.created_at,
    )


def list_memories(session: Session, build_run_id: str | None = None) -> list[WorkflowMemory]:
    """The memories of build run ``build_run_id`` (every memory when None), in the order they were written."""
    stmt = sa.select(MemoryRow).order_by(MemoryRow.created_at, MemoryRow.id)
    if build_run_id is not None:
        stmt = stmt.where(MemoryRow.build_run_id == build_run_id)
    return [_memory(row) for row in session.scalars(stmt)]

