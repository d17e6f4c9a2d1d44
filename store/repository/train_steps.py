"""Training steps: each optimiser step's losses and metrics, one row per (run, step)."""

from __future__ import annotations

import sqlalchemy as sa
from sqlalchemy.orm import Session

from agentmem.records import TrainStep
from store.orm import TrainStepRow
from store.repository.rows import insert_ignore


def count_train_steps(session: Session, run_id: str) -> int:
    return session.scalar(sa.select(sa.func.count()).where(TrainStepRow.run_id == run_id)) or 0


def insert_train_step(session: Session, step: TrainStep) -> None:
    """The step's row; its columns ``kd_loss`` and ``rl_loss`` copy those terms' values from ``metrics``, where
    every term's value lives (SQL over the table reads them there too)."""
    row = {**step.model_dump(mode="python"), "kd_loss": step.kd_loss, "rl_loss": step.rl_loss}
    insert_ignore(session, TrainStepRow.__table__, [row])


def _metrics(r: TrainStepRow) -> dict[str, float]:
    """A row's metrics; a row whose metrics lack the kd or rl term (written by an agentmem that kept those
    two in their columns only) gets them from the columns when they are non-zero."""
    columns = {"kd_loss": r.kd_loss, "rl_loss": r.rl_loss}
    return {**{k: v for k, v in columns.items() if v and k not in r.metrics}, **r.metrics}


def list_train_steps(session: Session, run_id: str) -> list[TrainStep]:
    rows = session.scalars(sa.select(TrainStepRow).where(TrainStepRow.run_id == run_id).order_by(TrainStepRow.step))
    return [
        TrainStep(id=r.id, run_id=r.run_id, step=r.step, loss=r.loss, tokens=r.tokens, lr=r.lr, seconds=r.seconds,
                  metrics=_metrics(r), created_at=r.created_at)
        for r in rows
    ]
