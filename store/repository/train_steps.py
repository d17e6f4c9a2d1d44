"""Training steps: each optimiser step's losses and metrics, one row per (run, step)."""

from __future__ import annotations

import sqlalchemy as sa
from sqlalchemy.orm import Session

from agentmem.records import TrainStep
from store.models import TrainStepRow
from store.repository.rows import insert_ignore


def count_train_steps(session: Session, run_id: str) -> int:
    return session.scalar(sa.select(sa.func.count()).where(TrainStepRow.run_id == run_id)) or 0


def insert_train_step(session: Session, step: TrainStep) -> None:
    insert_ignore(session, TrainStepRow.__table__, [step.model_dump(mode="python")])


def list_train_steps(session: Session, run_id: str) -> list[TrainStep]:
    rows = session.scalars(sa.select(TrainStepRow).where(TrainStepRow.run_id == run_id).order_by(TrainStepRow.step))
    return [
        TrainStep(id=r.id, run_id=r.run_id, step=r.step, loss=r.loss, kd_loss=r.kd_loss, rl_loss=r.rl_loss,
                  tokens=r.tokens, lr=r.lr, seconds=r.seconds, metrics=r.metrics, created_at=r.created_at)
        for r in rows
    ]
