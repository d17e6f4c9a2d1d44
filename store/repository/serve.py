"""Repository functions of ``agentmem serve``: episodes that grow one call at a time in arrival order.

A served episode's calls arrive one by one from a client, so its next step and a new episode's sample
index (its place among the run's episodes of one task) are read from the store in the transaction that
writes the call. One server process writes a run, and it serialises these transactions itself.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import sqlalchemy as sa
from sqlalchemy.orm import Session

from agentmem.records import ServeCall
from store import arrays
from store.errors import NotFound
from store.orm import EpisodeRow, InvocationRow, ServeCallRow


def next_step(session: Session, episode_id: str) -> int:
    """The step the next call of ``episode_id`` gets: one past its last stored call, 0 for none."""
    last = session.scalar(sa.select(sa.func.max(InvocationRow.step)).where(InvocationRow.episode_id == episode_id))
    return 0 if last is None else int(last) + 1


def next_sample_index(session: Session, run_id: str, task_id: str) -> int:
    """One past the largest sample index of the run's episodes of ``task_id`` (0 for its first)."""
    last = session.scalar(sa.select(sa.func.max(EpisodeRow.sample_index))
                          .where(EpisodeRow.run_id == run_id, EpisodeRow.task_id == task_id))
    return 0 if last is None else int(last) + 1


def episode_in_run(session: Session, run_id: str, episode_id: str) -> bool:
    return session.scalar(sa.select(sa.func.count()).select_from(EpisodeRow)
                          .where(EpisodeRow.id == episode_id, EpisodeRow.run_id == run_id)) == 1


def invocation_exists(session: Session, invocation_id: str) -> bool:
    return session.get(InvocationRow, invocation_id) is not None


def set_prediction(session: Session, episode_id: str, prediction: str) -> None:
    """An episode's latest output, its prediction until a reward says otherwise."""
    session.execute(sa.update(EpisodeRow).where(EpisodeRow.id == episode_id)
                    .values(prediction=prediction.replace("\x00", "\ufffd")))


def set_privileged(session: Session, episode_id: str, answers: list[str], evidence: list[str]) -> None:
    """The privileged context of an episode (its gold answers and evidence, which the ``privileged`` teacher
    context renders)."""
    done = session.execute(sa.update(EpisodeRow).where(EpisodeRow.id == episode_id)
                           .values(gold_answers=answers, evidence=evidence))
    if done.rowcount == 0:
        raise NotFound(f"no episode with id {episode_id!r}")


def insert_serve_calls(session: Session, calls: Iterable[ServeCall]) -> None:
    session.add_all([ServeCallRow(
        invocation_id=c.invocation_id, messages=c.messages, tools=c.tools, sampling=c.sampling, client=c.client,
        prompt_logprobs=None if c.prompt_logprobs is None else arrays.encode(c.prompt_logprobs, arrays.FLOATS),
        replayable=c.replayable, created_at=c.created_at) for c in calls])


def get_serve_call(session: Session, invocation_id: str) -> ServeCall:
    row = session.get(ServeCallRow, invocation_id)
    if row is None:
        raise NotFound(f"no served call with invocation id {invocation_id!r}")
    return _serve_call(row)


def unreplayable_calls(session: Session, run_ids: Sequence[str]) -> dict[str, int]:
    """Per run of ``run_ids`` that has any: how many of its served calls are not replayable (text from a
    provider, tokenized locally)."""
    rows = session.execute(sa.select(EpisodeRow.run_id, sa.func.count())
                           .join(InvocationRow, InvocationRow.episode_id == EpisodeRow.id)
                           .join(ServeCallRow, ServeCallRow.invocation_id == InvocationRow.id)
                           .where(EpisodeRow.run_id.in_(list(run_ids)), ServeCallRow.replayable.is_(False))
                           .group_by(EpisodeRow.run_id))
    return {rid: int(n) for rid, n in rows}


def chat_serve_calls(session: Session, run_ids: Sequence[str]) -> dict[str, ServeCall]:
    """The served chat calls of ``run_ids`` (those that sent ``messages``), by invocation id."""
    rows = session.scalars(sa.select(ServeCallRow)
                           .join(InvocationRow, InvocationRow.id == ServeCallRow.invocation_id)
                           .join(EpisodeRow, EpisodeRow.id == InvocationRow.episode_id)
                           .where(EpisodeRow.run_id.in_(list(run_ids))))
    return {row.invocation_id: _serve_call(row) for row in rows if row.messages}


def _serve_call(row: ServeCallRow) -> ServeCall:
    return ServeCall(invocation_id=row.invocation_id, messages=row.messages, tools=row.tools, sampling=row.sampling,
                     client=row.client, created_at=row.created_at, replayable=row.replayable,
                     prompt_logprobs=None if row.prompt_logprobs is None
                     else arrays.decode(row.prompt_logprobs, arrays.FLOATS))
