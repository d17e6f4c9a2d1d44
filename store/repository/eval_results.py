"""Evaluation results: one row per evaluated model and environment, with bootstrap intervals stored as
low/high columns."""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from sqlalchemy.orm import Session

from agentmem.records import EvalResult
from store.orm import EvalResultRow
from store.repository.rows import insert_ignore


def insert_eval_result(session: Session, result: EvalResult) -> None:
    d = result.model_dump(mode="python")
    for name in ("f1", "em", "sub_em"):
        lo, hi = d.pop(f"{name}_ci")
        d[f"{name}_lo"], d[f"{name}_hi"] = lo, hi
    insert_ignore(session, EvalResultRow.__table__, [d])


def list_eval_results(session: Session, run_ids: Sequence[str] | None = None,
                      checkpoint_ids: Sequence[str] | None = None) -> list[EvalResult]:
    """Eval results, oldest first: of the eval runs ``run_ids`` and/or of the checkpoints ``checkpoint_ids``."""
    stmt = sa.select(EvalResultRow).order_by(EvalResultRow.created_at)
    if run_ids is not None:
        stmt = stmt.where(EvalResultRow.run_id.in_(run_ids))
    if checkpoint_ids is not None:
        stmt = stmt.where(EvalResultRow.checkpoint_id.in_(checkpoint_ids))
    return [
        EvalResult(
            id=r.id, run_id=r.run_id, checkpoint_id=r.checkpoint_id, model=r.model, env=r.env, step=r.step,
            n_episodes=r.n_episodes, f1=r.f1, em=r.em, sub_em=r.sub_em, f1_ci=(r.f1_lo, r.f1_hi),
            em_ci=(r.em_lo, r.em_hi), sub_em_ci=(r.sub_em_lo, r.sub_em_hi), metrics=r.metrics,
            created_at=r.created_at,
        )
        for r in session.scalars(stmt)
    ]
