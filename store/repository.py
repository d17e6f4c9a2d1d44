"""Repository functions: records in, records out. Every function takes the session; the caller owns the
transaction (commit after each unit of completed work, so a killed job loses at most the work in flight).

Inserts are idempotent: a row whose id or natural key (episode+step for invocations, run+task+sample for
episodes, invocation+teacher+context for teacher scores, run+step for train steps) already exists is
skipped, so a resumed job can re-offer what it is not sure was written.

A run's life: ``start_run`` (running, with this process's pid and host), ``heartbeat`` as work completes,
``finish_run`` (finished, failed with its error, or interrupted), ``claim_run`` to take it over for a
resume. ``run_liveness`` tells a live running run from one whose process was killed.
"""

from __future__ import annotations

import os
import socket
import uuid
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, cast

import numpy as np
import sqlalchemy as sa
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.orm import Session

from agentmem.records import (
    Checkpoint,
    Episode,
    EpisodeStatus,
    EvalResult,
    FinishReason,
    Invocation,
    InvocationKind,
    Run,
    RunKind,
    SamplingContext,
    TeacherContext,
    TeacherScore,
    TrainStep,
    utcnow,
)
from store import arrays
from store.errors import NotFound
from store.models import (
    CheckpointRow,
    EpisodeRow,
    EvalResultRow,
    InvocationRow,
    RunRow,
    TeacherScoreRow,
    TrainStepRow,
)

STALE_AFTER = timedelta(minutes=10)  # a run on another host without a heartbeat for this long is "stale"


def _text(value: str | None) -> str | None:
    """Text columns are for people (replay reads the ids): a NUL, which a byte-level tokenizer can decode
    and Postgres text cannot hold, is stored as U+FFFD on every database alike."""
    return value.replace("\x00", "\ufffd") if value else value


text_column = _text  # how text columns are stored (store.leases writes an episode's last error)


def _insert_ignore(session: Session, table: sa.Table, rows: list[dict[str, Any]]) -> None:
    if not rows:
        return
    dialect = session.get_bind().dialect.name
    insert = postgresql.insert if dialect == "postgresql" else sqlite.insert
    session.execute(insert(table).on_conflict_do_nothing(), rows)


def _get(session: Session, model: type[Any], ident: str, what: str, hint: str = ""):
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


# ---- runs -------------------------------------------------------------------------------------------


def insert_run(session: Session, run: Run) -> None:
    _insert_ignore(session, RunRow.__table__, [run.model_dump(mode="python")])


def _this_process() -> dict[str, Any]:
    return {"pid": os.getpid(), "host": socket.gethostname(), "heartbeat_at": utcnow()}


def start_run(session: Session, run: Run) -> Run:
    """Insert ``run`` as running in this process (pid, host, heartbeat now); return what was stored."""
    started = run.model_copy(update={"status": "running", **_this_process()})
    insert_run(session, started)
    return started


def heartbeat(session: Session, run_id: str) -> None:
    """Mark run ``run_id`` as still alive now."""
    _update_run(session, run_id, heartbeat_at=utcnow())


def finish_run(session: Session, run_id: str, status: str = "finished", error: str | None = None) -> None:
    """End a run: ``status`` (finished, failed, interrupted), the time, and for a failure its one-line error."""
    _update_run(session, run_id, status=status, finished_at=utcnow(), error=_text(error))


def claim_run(session: Session, run_id: str) -> Run:
    """Take over run ``run_id`` for a resume: running again, in this process, with its old error cleared."""
    run_id = _get(session, RunRow, run_id, "run", " (see `agentmem runs`)").id
    _update_run(session, run_id, status="running", finished_at=None, error=None, **_this_process())
    return get_run(session, run_id)


def _update_run(session: Session, run_id: str, **values: Any) -> None:
    if session.execute(sa.update(RunRow).where(RunRow.id == run_id).values(**values)).rowcount == 0:
        raise NotFound(f"no run with id {run_id!r} (see `agentmem runs`)")


def _run(row: RunRow) -> Run:
    return Run(id=row.id, kind=RunKind(row.kind), config=row.config, status=row.status,
               created_at=row.created_at, finished_at=row.finished_at, error=row.error, pid=row.pid,
               host=row.host, heartbeat_at=row.heartbeat_at)


def get_run(session: Session, run_id: str) -> Run:
    return _run(_get(session, RunRow, run_id, "run", " (see `agentmem runs`)"))


def pid_alive(pid: int) -> bool:
    """Whether process ``pid`` exists on this host."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # it exists, under another user
        return True
    return True


def run_liveness(run: Run, *, now: datetime | None = None) -> str:
    """Whether a running run's process still runs: "live", "dead" (its pid is gone from this host: it
    was killed), "stale" (on another host, no heartbeat for ``STALE_AFTER``), "unknown" (no pid stored);
    "" for a run that has ended."""
    if run.status != "running":
        return ""
    if run.pid is None:
        return "unknown"
    if run.host == socket.gethostname():
        return "live" if pid_alive(run.pid) else "dead"
    beat = run.heartbeat_at or run.created_at
    return "stale" if (now or utcnow()) - beat > STALE_AFTER else "live"


@dataclass(frozen=True)
class RunSummary:
    run: Run
    episodes: int
    invocations: int
    mean_f1: float | None
    liveness: str = ""  # see run_liveness


def list_runs(session: Session, limit: int | None = None, offset: int = 0) -> list[RunSummary]:
    """Runs, newest first, with their episode and invocation counts and mean F1 (aggregated in SQL)."""
    inv_counts = (
        sa.select(EpisodeRow.run_id, sa.func.count(InvocationRow.id).label("n"))
        .join(InvocationRow, InvocationRow.episode_id == EpisodeRow.id)
        .group_by(EpisodeRow.run_id)
        .subquery()
    )
    ep_counts = (
        sa.select(EpisodeRow.run_id, sa.func.count(EpisodeRow.id).label("n"), sa.func.avg(EpisodeRow.f1).label("f1"))
        .group_by(EpisodeRow.run_id)
        .subquery()
    )
    stmt = (
        sa.select(RunRow, ep_counts.c.n, inv_counts.c.n, ep_counts.c.f1)
        .outerjoin(ep_counts, ep_counts.c.run_id == RunRow.id)
        .outerjoin(inv_counts, inv_counts.c.run_id == RunRow.id)
        .order_by(RunRow.created_at.desc(), RunRow.id)
        .limit(limit)
        .offset(offset or None)
    )
    now = utcnow()
    summaries = []
    for row, n_ep, n_inv, f1 in session.execute(stmt):
        run = _run(row)
        summaries.append(RunSummary(run, n_ep or 0, n_inv or 0, f1, run_liveness(run, now=now)))
    return summaries


def count_runs(session: Session) -> int:
    return session.scalar(sa.select(sa.func.count(RunRow.id))) or 0


def list_runs_of_kind(session: Session, kind: RunKind) -> list[Run]:
    """Runs of one kind, oldest first."""
    rows = session.scalars(sa.select(RunRow).where(RunRow.kind == RunKind(kind).value).order_by(RunRow.created_at))
    return [_run(r) for r in rows]


def run_policy_versions(session: Session, run_ids: Sequence[str]) -> dict[str, list[str]]:
    """The policy versions (checkpoint ids) that sampled each run's calls, per run, in id order; a run whose
    calls have none (an oracle run) is absent."""
    stmt = (
        sa.select(EpisodeRow.run_id, InvocationRow.policy_version)
        .join(InvocationRow, InvocationRow.episode_id == EpisodeRow.id)
        .where(EpisodeRow.run_id.in_(list(run_ids)), InvocationRow.policy_version.is_not(None))
        .group_by(EpisodeRow.run_id, InvocationRow.policy_version)
        .order_by(EpisodeRow.run_id, InvocationRow.policy_version)
    )
    out: dict[str, list[str]] = {}
    for run_id, version in session.execute(stmt):
        out.setdefault(run_id, []).append(version)
    return out


# ---- checkpoints ------------------------------------------------------------------------------------


def insert_checkpoint(session: Session, ckpt: Checkpoint) -> None:
    _insert_ignore(session, CheckpointRow.__table__, [ckpt.model_dump(mode="python")])


def _checkpoint(row: CheckpointRow) -> Checkpoint:
    return Checkpoint(id=row.id, run_id=row.run_id, parent_id=row.parent_id, step=row.step, path=row.path,
                      base_model=row.base_model, created_at=row.created_at)


def get_checkpoint(session: Session, checkpoint_id: str) -> Checkpoint:
    return _checkpoint(_get(session, CheckpointRow, checkpoint_id, "checkpoint"))


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


# ---- episodes ---------------------------------------------------------------------------------------


def insert_episodes(session: Session, episodes: Iterable[Episode]) -> None:
    _insert_ignore(session, EpisodeRow.__table__, [e.model_dump(mode="python") for e in episodes])


def outcome_values(episode: Episode) -> dict[str, Any]:
    """The outcome columns of an episode (prediction, scores, status, stop reason, error, times)."""
    values = episode.model_dump(
        mode="python",
        include={"prediction", "reward", "f1", "em", "sub_em", "status", "stop_reason", "error", "finished_at",
                 "n_chunks"},
    )
    values["prediction"], values["error"] = _text(values["prediction"]), _text(values["error"])
    return values


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


episode_record = _episode  # the record of a row (store.leases reads the rows it claims)


def get_episode(session: Session, episode_id: str) -> Episode:
    return _episode(_get(session, EpisodeRow, episode_id, "episode"))


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


# ---- invocations ------------------------------------------------------------------------------------


def _kind_value(kind: InvocationKind | str) -> str:
    """Kinds are stored as plain strings (``InvocationKind`` members by their value)."""
    return kind.value if isinstance(kind, InvocationKind) else str(kind)


def _invocation_row(inv: Invocation) -> dict[str, Any]:
    return {
        "id": inv.id, "episode_id": inv.episode_id, "step": inv.step, "kind": _kind_value(inv.kind),
        "memory_policy": inv.memory_policy, "policy_version": inv.policy_version,
        "prompt_ids": arrays.encode(inv.prompt_ids, arrays.IDS),
        "output_ids": arrays.encode(inv.output_ids, arrays.IDS),
        "output_logprobs": None if inv.output_logprobs is None else arrays.encode(inv.output_logprobs, arrays.FLOATS),
        "role": inv.role, "prompt_text": _text(inv.prompt_text), "output_text": _text(inv.output_text),
        "memory_before": _text(inv.memory_before), "memory_after": _text(inv.memory_after),
        "chunk_text": _text(inv.chunk_text), "chunk_index": inv.chunk_index,
        "prompt_tokens": inv.prompt_tokens, "output_tokens": inv.output_tokens,
        "finish_reason": inv.finish_reason.value, "temperature": inv.temperature, "latency_s": inv.latency_s,
        "created_at": inv.created_at, "sampled_context": SamplingContext(inv.sampled_context).value,
        "privileged_ids": None if inv.privileged_ids is None else arrays.encode(inv.privileged_ids, arrays.IDS),
        "parent_invocation_id": inv.parent_invocation_id,
    }


def insert_invocations(session: Session, invocations: Iterable[Invocation]) -> None:
    _insert_ignore(session, InvocationRow.__table__, [_invocation_row(i) for i in invocations])


_INV_COLUMNS = [c for c in InvocationRow.__table__.c if c.name not in ("prompt_tokens", "output_tokens")]
# every field is set; shared by every streamed row, so frozen (pydantic only reads it, or copies it on update)
_INV_FIELDS = cast("set[str]", frozenset(Invocation.model_fields))


def _invocation(row: sa.Row) -> Invocation:
    # Values come from our own typed columns, so validation is skipped (this is the replay hot path).
    m = row._mapping
    return Invocation.model_construct(
        id=m["id"], episode_id=m["episode_id"], step=m["step"], kind=m["kind"], memory_policy=m["memory_policy"],
        policy_version=m["policy_version"],
        prompt_ids=arrays.decode(m["prompt_ids"], arrays.IDS),
        output_ids=arrays.decode(m["output_ids"], arrays.IDS),
        output_logprobs=None if m["output_logprobs"] is None else arrays.decode(m["output_logprobs"], arrays.FLOATS),
        role=m["role"], prompt_text=m["prompt_text"], output_text=m["output_text"], memory_before=m["memory_before"],
        memory_after=m["memory_after"], chunk_text=m["chunk_text"], chunk_index=m["chunk_index"],
        finish_reason=FinishReason(m["finish_reason"]), temperature=m["temperature"], latency_s=m["latency_s"],
        created_at=m["created_at"], sampled_context=SamplingContext(m["sampled_context"]),
        privileged_ids=None if m["privileged_ids"] is None else arrays.decode(m["privileged_ids"], arrays.IDS),
        parent_invocation_id=m["parent_invocation_id"], _fields_set=_INV_FIELDS,
    )


def stream_invocations(
    session: Session,
    *,
    run_ids: Sequence[str] | None = None,
    episode_ids: Sequence[str] | None = None,
    kinds: Sequence[InvocationKind | str] | None = None,
    policy_versions: Sequence[str] | None = None,
    batch_size: int = 500,
) -> Iterator[Invocation]:
    """Invocations matching every given filter, streamed in (episode id, step) order: a stable order in
    which each episode's calls are contiguous and in step order."""
    stmt = sa.select(*_INV_COLUMNS).order_by(InvocationRow.episode_id, InvocationRow.step)
    if run_ids is not None:
        stmt = stmt.join(EpisodeRow, EpisodeRow.id == InvocationRow.episode_id).where(EpisodeRow.run_id.in_(run_ids))
    if episode_ids is not None:
        stmt = stmt.where(InvocationRow.episode_id.in_(episode_ids))
    if kinds is not None:
        stmt = stmt.where(InvocationRow.kind.in_([_kind_value(k) for k in kinds]))
    if policy_versions is not None:
        stmt = stmt.where(InvocationRow.policy_version.in_(policy_versions))
    result = session.execute(stmt.execution_options(yield_per=batch_size))
    for row in result:
        yield _invocation(row)


def count_invocations(session: Session, run_ids: Sequence[str]) -> int:
    return session.scalar(
        sa.select(sa.func.count(InvocationRow.id))
        .join(EpisodeRow, EpisodeRow.id == InvocationRow.episode_id)
        .where(EpisodeRow.run_id.in_(run_ids))
    ) or 0


def count_teacher_scores(session: Session, run_id: str) -> int:
    """Rows score run ``run_id`` wrote."""
    return session.scalar(sa.select(sa.func.count()).where(TeacherScoreRow.run_id == run_id)) or 0


def count_train_steps(session: Session, run_id: str) -> int:
    return session.scalar(sa.select(sa.func.count()).where(TrainStepRow.run_id == run_id)) or 0


def episode_invocations(session: Session, episode_id: str) -> list[Invocation]:
    return list(stream_invocations(session, episode_ids=[episode_id]))


# ---- teacher scores ---------------------------------------------------------------------------------


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
    _insert_ignore(session, TeacherScoreRow.__table__, rows)


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


# ---- training and evaluation ------------------------------------------------------------------------


def insert_train_step(session: Session, step: TrainStep) -> None:
    _insert_ignore(session, TrainStepRow.__table__, [step.model_dump(mode="python")])


def list_train_steps(session: Session, run_id: str) -> list[TrainStep]:
    rows = session.scalars(sa.select(TrainStepRow).where(TrainStepRow.run_id == run_id).order_by(TrainStepRow.step))
    return [
        TrainStep(id=r.id, run_id=r.run_id, step=r.step, loss=r.loss, kd_loss=r.kd_loss, rl_loss=r.rl_loss,
                  tokens=r.tokens, lr=r.lr, seconds=r.seconds, metrics=r.metrics, created_at=r.created_at)
        for r in rows
    ]


def insert_eval_result(session: Session, result: EvalResult) -> None:
    d = result.model_dump(mode="python")
    for name in ("f1", "em", "sub_em"):
        lo, hi = d.pop(f"{name}_ci")
        d[f"{name}_lo"], d[f"{name}_hi"] = lo, hi
    _insert_ignore(session, EvalResultRow.__table__, [d])


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


