"""Episode leases: a rollout run's episodes are work items that many workers share.

A worker (``owner``: a string unique to one process, ``new_owner()``) claims a batch of a run's episodes;
each claim sets the episode's owner, its expiry and counts one attempt. The worker renews its leases while
it works, and only the owner may store an episode's calls or its outcome: ``insert_invocations`` and
``finish_episodes`` check the ownership and write in the caller's one transaction, and raise ``LeaseLost``
(writing nothing) when any episode was taken over. A lease that expires (its worker was killed or stalled)
is claimed again by anyone; the new owner resumes the episode from its stored calls, and the old owner's
next write is refused, so an episode's calls never mix two histories.

Invariants:
- an episode is claimable when it is ``running`` and has no owner or an expired lease; it is never claimed
  by the owner that holds it;
- on Postgres the claim is ``SELECT ... FOR NO KEY UPDATE SKIP LOCKED``, then the ``UPDATE`` of the rows
  it locked (one transaction), so two workers never claim one episode and a claim never waits; on SQLite
  it is one ``UPDATE`` whose subquery picks the rows, atomic under SQLite's single writer;
- writes lock the episode rows first (the guarding ``UPDATE ... RETURNING``), so a claim cannot slip
  between the check and the write; a claim never waits on a writer (it skips locked rows), so there is no
  lock cycle;
- ownership depends on the owner column only, never on clocks: a worker whose lease expired keeps
  writing until someone else claims the episode. Clocks (each worker's UTC clock) only decide when a lease
  may be taken over, so workers' clocks must agree to well within the lease time;
- an episode claimed ``max_attempts`` times without finishing is marked ``failed`` (with its last error, or
  "lease expired N times") instead of being claimed again; a worker that stops cleanly gives its attempt
  back (``release`` without an error);
- a run is marked finished only when none of its episodes is running (``finish_run_if_done``: one
  statement, so the last of several workers to finish does it, exactly once).

Every function takes the session; the caller commits (one transaction per unit of work).
"""

from __future__ import annotations

import os
import socket
import uuid
from collections.abc import Collection, Iterable
from datetime import timedelta

import sqlalchemy as sa
from sqlalchemy.orm import Session

from agentmem.records import Episode, EpisodeStatus, Invocation, utcnow
from store import repository as repo
from store.errors import LeaseLost
from store.orm import EpisodeRow, RunRow

RUNNING = EpisodeStatus.running.value
EXHAUSTED = "lease attempts exhausted"


def new_owner() -> str:
    """An owner name unique to this process: ``host:pid:random``."""
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


def _free(now):
    return sa.or_(EpisodeRow.lease_owner.is_(None), EpisodeRow.lease_expires_at < now)


def _claimable(run_id: str, now, owner: str):
    return sa.and_(EpisodeRow.run_id == run_id, EpisodeRow.status == RUNNING, _free(now),
                   EpisodeRow.lease_owner.is_distinct_from(owner))


def _picked(session: Session, pick: sa.Select):
    """The condition "one of the rows ``pick`` selects". On Postgres the rows are selected (and locked:
    ``FOR NO KEY UPDATE SKIP LOCKED``) by a statement of their own first: inside an ``UPDATE``, a limited
    subquery may be evaluated more than once and lock more rows than its limit. On SQLite the subquery is
    evaluated once, inside the one atomic ``UPDATE``."""
    if session.get_bind().dialect.name == "postgresql":
        return EpisodeRow.id.in_(list(session.scalars(pick).all()))
    return EpisodeRow.id.in_(pick.scalar_subquery())


def claim(session: Session, run_id: str, owner: str, n: int | None, ttl: float, max_attempts: int) -> list[Episode]:
    """Claim up to ``n`` (None: all) claimable episodes of run ``run_id`` for ``owner`` for ``ttl`` seconds,
    in (task, sample) order; each claim counts an attempt. Claimable episodes that already used
    ``max_attempts`` are marked failed instead (``fail_exhausted``)."""
    now = utcnow()
    fail_exhausted(session, run_id, owner, max_attempts)
    pick = (sa.select(EpisodeRow.id)
            .where(_claimable(run_id, now, owner), EpisodeRow.attempts < max_attempts)
            .order_by(EpisodeRow.task_id, EpisodeRow.sample_index)
            .limit(n)
            .with_for_update(skip_locked=True, key_share=True))
    ids = session.scalars(
        sa.update(EpisodeRow)
        .where(_picked(session, pick), _claimable(run_id, now, owner))
        .values(lease_owner=owner, lease_expires_at=now + timedelta(seconds=ttl), attempts=EpisodeRow.attempts + 1)
        .returning(EpisodeRow.id)
    ).all()
    if not ids:
        return []
    rows = session.scalars(sa.select(EpisodeRow).where(EpisodeRow.id.in_(ids))
                           .order_by(EpisodeRow.task_id, EpisodeRow.sample_index))
    return [repo.episode_record(r) for r in rows]


def fail_exhausted(session: Session, run_id: str, owner: str, max_attempts: int) -> list[str]:
    """Mark failed every claimable episode of the run that was claimed ``max_attempts`` times already: its
    error is its last one (``release``), else "lease expired N times". Returns their ids."""
    now = utcnow()
    pick = (sa.select(EpisodeRow.id)
            .where(_claimable(run_id, now, owner), EpisodeRow.attempts >= max_attempts)
            .with_for_update(skip_locked=True, key_share=True))
    expired = sa.literal("lease expired ") + sa.cast(EpisodeRow.attempts, sa.String) + sa.literal(" times")
    return list(session.scalars(
        sa.update(EpisodeRow)
        .where(_picked(session, pick), _claimable(run_id, now, owner))
        .values(status=EpisodeStatus.failed.value, stop_reason=EXHAUSTED, reward=0.0, finished_at=now,
                error=sa.func.coalesce(EpisodeRow.error, expired), lease_owner=None, lease_expires_at=None)
        .returning(EpisodeRow.id)
    ).all())


def renew(session: Session, owner: str, episode_ids: Collection[str], ttl: float) -> set[str]:
    """Extend ``owner``'s leases on these episodes by ``ttl`` seconds from now; return the ids it still
    holds (running, owned by it). The rows stay locked until the transaction ends."""
    if not episode_ids:
        return set()
    return set(session.scalars(
        sa.update(EpisodeRow)
        .where(EpisodeRow.id.in_(sorted(episode_ids)), EpisodeRow.lease_owner == owner, EpisodeRow.status == RUNNING)
        .values(lease_expires_at=utcnow() + timedelta(seconds=ttl))
        .returning(EpisodeRow.id)
    ).all())


def _hold(session: Session, owner: str, episode_ids: set[str], ttl: float) -> None:
    lost = episode_ids - renew(session, owner, episode_ids, ttl)
    if lost:
        raise LeaseLost(owner, lost)


def insert_invocations(session: Session, owner: str, invocations: Iterable[Invocation], ttl: float) -> None:
    """Store calls of episodes ``owner`` holds, renewing those leases, in the caller's transaction. If any
    episode is no longer held, raise ``LeaseLost`` naming every such episode, having inserted nothing."""
    invocations = list(invocations)
    _hold(session, owner, {i.episode_id for i in invocations}, ttl)
    repo.insert_invocations(session, invocations)


def finish_episodes(session: Session, owner: str, episodes: Iterable[Episode]) -> None:
    """Write the outcomes of episodes ``owner`` holds and end their leases; ``LeaseLost`` (nothing written)
    if any is no longer held."""
    episodes = list(episodes)
    _hold(session, owner, {e.id for e in episodes}, 0.0)
    for ep in episodes:
        session.execute(sa.update(EpisodeRow).where(EpisodeRow.id == ep.id)
                        .values(**repo.outcome_values(ep), lease_owner=None, lease_expires_at=None))


def release(session: Session, owner: str, episode_ids: Collection[str], error: str | None = None) -> int:
    """End ``owner``'s leases on these running episodes so another worker may claim them at once. With
    ``error`` (the worker failed) the attempt counts and the error is kept as the episode's last one;
    without (the worker stopped cleanly: interrupted, shutting down) the attempt is given back."""
    if not episode_ids:
        return 0
    values: dict = {"lease_owner": None, "lease_expires_at": None}
    if error is None:
        values["attempts"] = sa.case((EpisodeRow.attempts > 0, EpisodeRow.attempts - 1), else_=0)
    else:
        values["error"] = repo.text_column(error)
    return session.execute(
        sa.update(EpisodeRow)
        .where(EpisodeRow.id.in_(sorted(episode_ids)), EpisodeRow.lease_owner == owner, EpisodeRow.status == RUNNING)
        .values(**values)
    ).rowcount


def release_dead(session: Session, run_id: str) -> int:
    """Release the leases of the run held by owners on this host whose process is gone (killed), so a
    resumed job need not wait for them to expire. Their attempts count."""
    host = socket.gethostname()
    owners = session.scalars(
        sa.select(EpisodeRow.lease_owner).distinct()
        .where(EpisodeRow.run_id == run_id, EpisodeRow.status == RUNNING, EpisodeRow.lease_owner.is_not(None))
    ).all()
    released = 0
    for owner in owners:
        parts = owner.rsplit(":", 2)
        if len(parts) == 3 and parts[0] == host and parts[1].isdigit() and not repo.pid_alive(int(parts[1])):
            released += session.execute(
                sa.update(EpisodeRow)
                .where(EpisodeRow.run_id == run_id, EpisodeRow.lease_owner == owner, EpisodeRow.status == RUNNING)
                .values(lease_owner=None, lease_expires_at=None)
            ).rowcount
    return released


def reset_attempts(session: Session, run_id: str) -> int:
    """Give the run's unleased running episodes their attempts back (``agentmem rollout --resume``: the user
    resumes after a kill or a crash, which was not the episodes' doing). Returns how many were reset."""
    result = session.execute(sa.update(EpisodeRow)
                             .where(EpisodeRow.run_id == run_id, EpisodeRow.status == RUNNING,
                                    EpisodeRow.lease_owner.is_(None), EpisodeRow.attempts > 0)
                             .values(attempts=0))
    return result.rowcount or 0


def running_episodes(session: Session, run_id: str) -> int:
    return session.scalar(sa.select(sa.func.count(EpisodeRow.id))
                          .where(EpisodeRow.run_id == run_id, EpisodeRow.status == RUNNING)) or 0


def finish_run_if_done(session: Session, run_id: str) -> bool:
    """Mark the run finished if none of its episodes is running (and it is not finished already); True
    when this call did it. One statement: of several workers finishing at once, exactly one does it."""
    none_running = ~sa.exists().where(EpisodeRow.run_id == run_id, EpisodeRow.status == RUNNING)
    return session.execute(
        sa.update(RunRow).where(RunRow.id == run_id, RunRow.status != "finished", none_running)
        .values(status="finished", finished_at=utcnow(), error=None)
    ).rowcount == 1


def runs_with_work(session: Session, kind: str) -> list[str]:
    """Ids of running runs of ``kind`` with claimable episodes, oldest first."""
    now = utcnow()
    stmt = (sa.select(RunRow.id).where(RunRow.kind == kind, RunRow.status == "running")
            .where(sa.exists().where(EpisodeRow.run_id == RunRow.id, EpisodeRow.status == RUNNING, _free(now)))
            .order_by(RunRow.created_at))
    return list(session.scalars(stmt).all())
