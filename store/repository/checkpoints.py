"""Checkpoints: model versions and where they live. Registering a model by path is idempotent: every
process gives one path the same id, and the earliest row stored for a path is the one returned."""

from __future__ import annotations

import uuid

import sqlalchemy as sa
from sqlalchemy.orm import Session

from agentmem.records import Checkpoint
from store.orm import CheckpointRow
from store.repository.rows import get_row, insert_ignore


def insert_checkpoint(session: Session, ckpt: Checkpoint) -> None:
    insert_ignore(session, CheckpointRow.__table__, [ckpt.model_dump(mode="python")])


def _checkpoint(row: CheckpointRow) -> Checkpoint:
    return Checkpoint(id=row.id, run_id=row.run_id, parent_id=row.parent_id, step=row.step, path=row.path,
                      base_model=row.base_model, created_at=row.created_at)


def get_checkpoint(session: Session, checkpoint_id: str) -> Checkpoint:
    return _checkpoint(get_row(session, CheckpointRow, checkpoint_id, "checkpoint"))


def find_checkpoint_by_path(session: Session, path: str) -> Checkpoint | None:
    row = session.scalars(
        sa.select(CheckpointRow).where(CheckpointRow.path == path).order_by(CheckpointRow.created_at.desc())
    ).first()
    return _checkpoint(row) if row else None


def checkpoint_id_for_path(path: str) -> str:
    """The id a model registered by path gets: the same in every process, so registration is idempotent."""
    return uuid.uuid5(uuid.NAMESPACE_URL, f"agentmem-checkpoint:{path}").hex


def register_checkpoint(session: Session, path: str, base_model: str) -> Checkpoint:
    """The checkpoint row for the model at ``path``: the earliest one stored, else a new one with the id
    ``checkpoint_id_for_path(path)``. Two processes registering one path at once get the same row."""
    found = _earliest_checkpoint(session, path)
    if found is None:
        new = Checkpoint(id=checkpoint_id_for_path(path), path=path, base_model=base_model)
        insert_checkpoint(session, new)
        found = _earliest_checkpoint(session, path)
        assert found is not None  # inserted, or another writer's row with this path exists
    return found


def _earliest_checkpoint(session: Session, path: str) -> Checkpoint | None:
    row = session.scalars(
        sa.select(CheckpointRow).where(CheckpointRow.path == path)
        .order_by(CheckpointRow.created_at, CheckpointRow.id).limit(1)
    ).first()
    return _checkpoint(row) if row else None


def list_checkpoints(session: Session, run_id: str) -> list[Checkpoint]:
    rows = session.scalars(sa.select(CheckpointRow).where(CheckpointRow.run_id == run_id).order_by(CheckpointRow.step))
    return [_checkpoint(r) for r in rows]
