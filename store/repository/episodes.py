"""Episodes: one agent trajectory each (task, gold answers, prediction, scores, status, stop reason,
error); their outcome columns, and one run's episodes with their call and token counts (aggregated in
SQL), filtered, sorted and paged for the viewer."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa
from sqlalchemy.orm import Session

from agentmem.records import Episode, EpisodeStatus
from store.bounds import UNIT_METRICS, check_outcome
from store.errors import NotFound
from store.orm import EpisodeRow, InvocationRow
from store.repository.rows import check_row, get_row, insert_ignore, text_column

TEXT = ("question", "prediction", "error", "stop_reason")  # for people: a NUL is kept as U+FFFD


def _row(episode: Episode) -> dict[str, Any]:
    row = episode.model_dump(mode="python")
    row.update({name: text_column(row[name]) for name in TEXT})
    check_outcome(episode.reward, {m: getattr(episode, m) for m in UNIT_METRICS}, f"episode {episode.id}: ")
    return check_row("episodes", row, f"episode {episode.id}: ")


def insert_episodes(session: Session, episodes: Iterable[Episode]) -> None:
    """Insert episodes (an id already stored is left as it is); a value outside the store's bounds
    (``store.bounds``) raises ``ValueOutOfBounds`` before any is written."""
    insert_ignore(session, EpisodeRow.__table__, [_row(e) for e in episodes])


def outcome_values(episode: Episode) -> dict[str, Any]:
    """The outcome columns of an episode (prediction, scores, status, stop reason, error, times)."""
    values = episode.model_dump(
        mode="python",
        include={"prediction", "reward", "f1", "em", "sub_em", "status", "stop_reason", "error", "finished_at",
                 "n_chunks"},
    )
    for name in ("prediction", "error", "stop_reason"):
        values[name] = text_column(values[name])
    check_outcome(episode.reward, {m: values[m] for m in UNIT_METRICS}, f"episode {episode.id}: ")
    return check_row("episodes", values, f"episode {episode.id}: ")


def update_episode(session: Session, episode: Episode) -> None:
    """Write an episode's outcome fields (prediction, scores, status, stop reason, error, times)."""
    result = session.execute(sa.update(EpisodeRow).where(EpisodeRow.id == episode.id)
                             .values(**outcome_values(episode)))
    if result.rowcount == 0:
        raise NotFound(f"no episode with id {episode.id!r}")


def _episode(row: EpisodeRow) -> Episode:
    return Episode(
        id=row.id, run_id=row.run_id, env=row.env, task_id=row.task_id, sample_index=row.sample_index,
        question=row.question, gold_answers=row.gold_answers, evidence=row.evidence, category=row.category,
        prediction=row.prediction, reward=row.reward, f1=row.f1, em=row.em, sub_em=row.sub_em,
        status=EpisodeStatus(row.status), stop_reason=row.stop_reason, error=row.error, n_chunks=row.n_chunks,
        created_at=row.created_at, finished_at=row.finished_at,
    )


episode_record = _episode  # the record of a row (store.repository.leases reads the rows it claims)


def get_episode(session: Session, episode_id: str) -> Episode:
    return _episode(get_row(session, EpisodeRow, episode_id, "episode"))


def list_episodes(session: Session, run_ids: Sequence[str] | str) -> list[Episode]:
    run_ids = [run_ids] if isinstance(run_ids, str) else list(run_ids)
    rows = session.scalars(
        sa.select(EpisodeRow)
        .where(EpisodeRow.run_id.in_(run_ids))
        .order_by(EpisodeRow.run_id, EpisodeRow.task_id, EpisodeRow.sample_index)
    )
    return [_episode(r) for r in rows]


def episode_f1s(session: Session, run_ids: Sequence[str]) -> dict[str, list[float]]:
    """The F1 of every scored episode of each run (one column read, for intervals and histograms)."""
    stmt = (sa.select(EpisodeRow.run_id, EpisodeRow.f1)
            .where(EpisodeRow.run_id.in_(list(run_ids)), EpisodeRow.f1.is_not(None)))
    out: dict[str, list[float]] = {rid: [] for rid in run_ids}
    for run_id, f1 in session.execute(stmt):
        out[run_id].append(f1)
    return out


@dataclass(frozen=True)
class EpisodeStats:
    """An episode with its number of calls and tokens (prompt + output, over its calls)."""

    episode: Episode
    calls: int
    tokens: int


EPISODE_SORTS = ("task", "status", "f1", "calls", "tokens", "stop_reason", "created")


def _episode_stats_select(run_id: str, status: str | None, search: str | None):
    calls = (
        sa.select(InvocationRow.episode_id, sa.func.count(InvocationRow.id).label("calls"),
                  sa.func.sum(InvocationRow.prompt_tokens + InvocationRow.output_tokens).label("tokens"))
        .join(EpisodeRow, EpisodeRow.id == InvocationRow.episode_id)
        .where(EpisodeRow.run_id == run_id)
        .group_by(InvocationRow.episode_id)
        .subquery()
    )
    n_calls, n_tokens = sa.func.coalesce(calls.c.calls, 0), sa.func.coalesce(calls.c.tokens, 0)
    stmt = (sa.select(EpisodeRow, n_calls, n_tokens).outerjoin(calls, calls.c.episode_id == EpisodeRow.id)
            .where(EpisodeRow.run_id == run_id))
    if status:
        stmt = stmt.where(EpisodeRow.status == status)
    if search:
        stmt = stmt.where(EpisodeRow.task_id.icontains(search, autoescape=True)
                          | EpisodeRow.question.icontains(search, autoescape=True)
                          | EpisodeRow.id.startswith(search, autoescape=True))
    return stmt, {"task": EpisodeRow.task_id, "status": EpisodeRow.status, "f1": EpisodeRow.f1, "calls": n_calls,
                  "tokens": n_tokens, "stop_reason": EpisodeRow.stop_reason, "created": EpisodeRow.created_at}


def list_episode_stats(session: Session, run_id: str, *, status: str | None = None, search: str | None = None,
                       sort: str = "task", descending: bool = False, limit: int | None = None,
                       offset: int = 0) -> list[EpisodeStats]:
    """One run's episodes with their call and token counts (aggregated in SQL), filtered by ``status`` and
    by ``search`` (a substring of the task id or question, or an episode id prefix), sorted by one of
    ``EPISODE_SORTS`` (empty values last), then by task and sample."""
    if sort not in EPISODE_SORTS:
        raise ValueError(f"sort must be one of {', '.join(EPISODE_SORTS)}, got {sort!r}")
    stmt, columns = _episode_stats_select(run_id, status, search)
    key = columns[sort].desc() if descending else columns[sort].asc()
    stmt = (stmt.order_by(key.nulls_last(), EpisodeRow.task_id, EpisodeRow.sample_index)
            .limit(limit).offset(offset or None))
    return [EpisodeStats(_episode(row), int(calls), int(tokens)) for row, calls, tokens in session.execute(stmt)]


def count_episodes(session: Session, run_id: str, *, status: str | None = None, search: str | None = None) -> int:
    """How many episodes ``list_episode_stats`` gives for these filters, without paging."""
    stmt, _ = _episode_stats_select(run_id, status, search)
    return session.scalar(sa.select(sa.func.count()).select_from(stmt.subquery())) or 0
