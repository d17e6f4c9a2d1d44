"""Runs: one per job, with its full config. A run's life: ``start_run`` (running, with this process's pid
and host), ``heartbeat`` as work completes, ``finish_run`` (finished, failed with its error, or
interrupted), ``claim_run`` to take it over for a resume. ``run_liveness`` tells a live running run from
one whose process was killed; ``list_runs`` gives each run with its counts, aggregated in SQL."""

from __future__ import annotations

import os
import socket
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

import sqlalchemy as sa
from sqlalchemy.orm import Session

from agentmem.records import Run, RunKind, utcnow
from store.errors import NotFound
from store.orm import EpisodeRow, InvocationRow, RunRow
from store.repository.rows import get_row, insert_ignore, text_column

STALE_AFTER = timedelta(minutes=10)  # a run on another host without a heartbeat for this long is "stale"


def insert_run(session: Session, run: Run) -> None:
    insert_ignore(session, RunRow.__table__, [run.model_dump(mode="python")])


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
    _update_run(session, run_id, status=status, finished_at=utcnow(), error=text_column(error))


def delete_run(session: Session, run_id: str) -> None:
    """Delete run ``run_id``, which must hold nothing yet (no episodes, calls or checkpoints)."""
    if session.execute(sa.delete(RunRow).where(RunRow.id == run_id)).rowcount == 0:
        raise NotFound(f"no run with id {run_id!r} (see `agentmem runs`)")


def claim_run(session: Session, run_id: str) -> Run:
    """Take over run ``run_id`` for a resume: running again, in this process, with its old error cleared."""
    run_id = get_row(session, RunRow, run_id, "run", " (see `agentmem runs`)").id
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
    return _run(get_row(session, RunRow, run_id, "run", " (see `agentmem runs`)"))


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
