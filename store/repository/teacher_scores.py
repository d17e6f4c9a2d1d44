"""Teacher scores: per invocation, teacher and context, the per-token teacher log-probs, reverse KL and
entropy (binary array columns) and their means."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import numpy as np
import sqlalchemy as sa
from sqlalchemy.orm import Session

from agentmem.records import TeacherContext, TeacherScore
from store import arrays
from store.orm import EpisodeRow, InvocationRow, TeacherScoreRow
from store.repository.rows import insert_ignore


def count_teacher_scores(session: Session, run_id: str) -> int:
    """Rows score run ``run_id`` wrote."""
    return session.scalar(sa.select(sa.func.count()).where(TeacherScoreRow.run_id == run_id)) or 0


def _mean(a: np.ndarray) -> float | None:
    return float(a.mean()) if a.size else None


def insert_teacher_scores(session: Session, scores: Iterable[TeacherScore]) -> None:
    rows = [
        {
            "id": s.id, "run_id": s.run_id, "invocation_id": s.invocation_id, "teacher": s.teacher,
            "context": s.context.value, "n_tokens": int(s.token_logprobs.shape[0]),
            "token_logprobs": arrays.encode(s.token_logprobs, arrays.FLOATS),
            "reverse_kl": arrays.encode(s.reverse_kl, arrays.FLOATS),
            "entropy": arrays.encode(s.entropy, arrays.FLOATS),
            "mean_logprob": _mean(s.token_logprobs), "mean_reverse_kl": _mean(s.reverse_kl),
            "mean_entropy": _mean(s.entropy), "topk_path": s.topk_path, "topk_key": s.topk_key,
            "temperature": s.temperature, "created_at": s.created_at,
        }
        for s in scores
    ]
    insert_ignore(session, TeacherScoreRow.__table__, rows)


def scored_invocation_ids(session: Session, teacher: str, context: TeacherContext) -> set[str]:
    rows = session.scalars(
        sa.select(TeacherScoreRow.invocation_id).where(
            TeacherScoreRow.teacher == teacher, TeacherScoreRow.context == TeacherContext(context).value
        )
    )
    return set(rows)


def get_teacher_scores(
    session: Session, invocation_ids: Sequence[str], teacher: str, context: TeacherContext
) -> dict[str, TeacherScore]:
    rows = session.scalars(
        sa.select(TeacherScoreRow).where(
            TeacherScoreRow.invocation_id.in_(invocation_ids),
            TeacherScoreRow.teacher == teacher,
            TeacherScoreRow.context == TeacherContext(context).value,
        )
    )
    return {
        r.invocation_id: TeacherScore(
            id=r.id, run_id=r.run_id, invocation_id=r.invocation_id, teacher=r.teacher,
            context=TeacherContext(r.context),
            token_logprobs=arrays.decode(r.token_logprobs, arrays.FLOATS),
            reverse_kl=arrays.decode(r.reverse_kl, arrays.FLOATS),
            entropy=arrays.decode(r.entropy, arrays.FLOATS),
            topk_path=r.topk_path, topk_key=r.topk_key, temperature=r.temperature, created_at=r.created_at,
        )
        for r in rows
    }


def teacher_score_keys(session: Session, invocation_ids: Sequence[str]) -> list[tuple[str, TeacherContext]]:
    """The (teacher, context) pairs under which any of these invocations was scored, sorted."""
    rows = session.execute(
        sa.select(TeacherScoreRow.teacher, TeacherScoreRow.context)
        .where(TeacherScoreRow.invocation_id.in_(list(invocation_ids)))
        .group_by(TeacherScoreRow.teacher, TeacherScoreRow.context)
        .order_by(TeacherScoreRow.teacher, TeacherScoreRow.context)
    )
    return [(teacher, TeacherContext(context)) for teacher, context in rows]


def teacher_score_summary(session: Session, run_id: str) -> list[tuple[str, TeacherContext, int]]:
    """(teacher, context, scored calls) of run ``run_id``: the scores of its calls when it is a rollout, or
    the scores it wrote when it is a score run; sorted by teacher and context."""
    own = sa.select(InvocationRow.id).join(EpisodeRow, EpisodeRow.id == InvocationRow.episode_id).where(
        EpisodeRow.run_id == run_id)
    rows = session.execute(
        sa.select(TeacherScoreRow.teacher, TeacherScoreRow.context, sa.func.count())
        .where(sa.or_(TeacherScoreRow.invocation_id.in_(own), TeacherScoreRow.run_id == run_id))
        .group_by(TeacherScoreRow.teacher, TeacherScoreRow.context)
        .order_by(TeacherScoreRow.teacher, TeacherScoreRow.context)
    )
    return [(teacher, TeacherContext(context), int(n)) for teacher, context, n in rows]
